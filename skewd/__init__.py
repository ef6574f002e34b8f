"""skewd: skew detection for GPU inference clusters."""
__version__ = "0.1.0"
