import pytest

# The conformance suite lives in the package; rewrite its asserts so failures show values.
pytest.register_assert_rewrite("autopersona_flows.testing")
