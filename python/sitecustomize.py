"""gradd's sitecustomize for program jobs: gradd's allocator in the program's
PyTorch from its first CUDA allocation on, then the user's own sitecustomize.

gradd puts this directory first on a program job's PYTHONPATH and names its
allocator library in GRADD_ALLOC_LIB.  PyTorch takes a new allocator only
before its first CUDA allocation, and the one moment every program passes
before that is the end of its `import torch`: a finder at the front of
sys.meta_path watches for that import and, once torch's own code has run,
calls gradd._alloc.install(), before the program's next statement.  Until
then nothing is loaded (no ctypes, no library, no torch), so a program that
never imports torch pays one string comparison per import.  Without
GRADD_ALLOC_LIB (the job opted out) no finder is installed.

Python runs only the first sitecustomize on sys.path, and this one would hide
the user's (a virtualenv's, conda's, the distribution's).  So the next one
after this directory runs here, once, as the module sitecustomize; an error in
it reaches site, which reports it as it reports any sitecustomize's.
"""
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))


def _install():
    try:
        from gradd import _alloc
        _alloc.install()
    except Exception as e:  # a shadowed or broken package must not break `import torch`
        sys.stderr.write("gradd: the allocator shim failed (%s: %s); PyTorch's own CUDA allocator is used\n"
                         % (type(e).__name__, " ".join(str(e).split())))


class _ThenInstall:
    """torch's own loader, followed by the allocator's installation."""

    def __init__(self, watch, inner):
        self._watch = watch
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        # torch's code and whoever inspects it later see torch's own loader.
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        # Only a torch that imported completely gets the allocator; after a
        # failed import the watch stays for the next attempt.
        self._watch.remove()
        _install()

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _TorchWatch:
    """The finder that hands out torch's spec with _ThenInstall as its loader."""

    def __init__(self):
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self._finding:
            return None
        # The spec the rest of the import system would find, so that a
        # virtualenv's or an editable install's finder still decides.
        self._finding = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._finding = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenInstall(self, spec.loader)
        return spec

    def remove(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _same_dir(entry):
    try:
        return os.path.realpath(entry or os.curdir) == _HERE
    except (OSError, ValueError):
        return False


def _run_next_sitecustomize():
    later = None
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        if _same_dir(entry):
            if later is None:
                later = []
        elif later is not None:
            later.append(entry)
    if not later:
        return
    # The import system's own PathFinder and module_from_spec, which
    # importlib.machinery and importlib.util re-export: importing those
    # costs 1 to 5 ms (warnings, contextlib, collections) at every start.
    try:
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder
    except ImportError:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec
    spec = PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    # Under its own name, so that `import sitecustomize` later finds it
    # without running it again.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("GRADD_ALLOC_LIB"):
    if "torch" in sys.modules:
        # A .pth file imported torch before site reached sitecustomize.
        _install()
    else:
        sys.meta_path.insert(0, _TorchWatch())
_run_next_sitecustomize()
