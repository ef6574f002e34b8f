pytest_plugins = ["tests.conftest_nats"]
