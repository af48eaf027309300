"""Every kernel test may force a path; the next test starts from the one that was active."""
import pytest

from inferd import _cpu


@pytest.fixture(autouse=True)
def restore_path():
    old = _cpu.get_path()
    yield
    _cpu.set_path(old)


@pytest.fixture
def kernel_path(request):
    """Runs the test on the path given by parametrize (indirect); restore_path puts the previous one back."""
    _cpu.set_path(request.param)
    return request.param
