import pytest

# The shared checks (check_windows, check_counts, ...) live in helper modules: have
# pytest rewrite their asserts too, so that a failure shows the values compared.
pytest.register_assert_rewrite("tests.integration.kafka_helpers")
