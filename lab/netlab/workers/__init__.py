"""Stand-alone scripts the lab runs inside its namespaces (by file path, with whichever
interpreter fits: the ranks may run in a torch venv that has no skewd, so these import nothing
from skewd)."""
