"""gradd's sitecustomize (python/) in fresh interpreters: a program that never
imports torch is untouched, `import torch` installs the allocator before the
program's next statement, the user's own sitecustomize still runs exactly
once with its errors reported as Python reports them, and a library that
cannot be used costs one "gradd:" line while the program carries on.

The shim runs in test mode here (GRADD_ALLOC_BACKEND=cpu, the library's
simulated device) against the built libgradd-alloc."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

LIB = os.path.realpath(os.environ["GRADD_TEST_ALLOC_LIB"])
SHIM = os.environ["GRADD_TEST_PYTHON_DIR"]
TAIL = "; PyTorch's own CUDA allocator is used\n"
NO_TORCH = "needs torch (Debian: python3-torch)"


def torch_info():
    """{"version", "cuda"} of this Python's torch, or None without one."""
    r = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps({'version': torch.__version__, "
                        "'cuda': torch.version.cuda}))"], env=child_env(lib=None), capture_output=True, text=True,
                       timeout=120)
    return json.loads(r.stdout) if r.returncode == 0 else None


def child_env(lib=LIB, path=(), **extra):
    """This environment without Python's or gradd's variables, then the
    shim's directory (and `path`) on PYTHONPATH and the library named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GRADD_"))}
    env["PYTHONPATH"] = os.pathsep.join([SHIM, *path])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["GRADD_ALLOC_BACKEND"] = "cpu"
    if lib is not None:
        env["GRADD_ALLOC_LIB"] = lib
    env.update(extra)
    return env


def run_python(code, lib=LIB, path=(), cwd=None, **extra):
    """Runs `code` in a fresh interpreter; the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-c", code], env=child_env(lib, path, **extra), cwd=cwd or "/",
                          capture_output=True, text=True, timeout=120)


TORCH = torch_info()

# What a child reports about the shim, as one JSON line.
PROBE = r"""
import json, sys
lib = __LIB__
def probe():
    maps = open("/proc/self/maps").read()
    torch = sys.modules.get("torch")
    out = {"lib_mapped": lib in maps, "ctypes": "ctypes" in sys.modules, "gradd": "gradd" in sys.modules,
           "watching": any(type(f).__name__ == "_TorchWatch" for f in sys.meta_path)}
    if torch is not None:
        alloc = sys.modules.get("gradd._alloc")
        out["served"] = [alloc is not None and getattr(m, n) is getattr(alloc, n)
                         for m in (torch.cuda, torch.cuda.memory)
                         for n in ("memory_allocated", "memory_stats", "empty_cache")]
        out["installed"] = bool(alloc and alloc.installed)
        out["torch_loader"] = type(torch.__loader__).__name__
        out["spec_loader"] = type(torch.__spec__.loader).__name__
    return out
""".replace("__LIB__", repr(LIB))


def probe(test, code, **kw):
    r = run_python(PROBE + code + "\nprint(json.dumps(probe()))", **kw)
    test.assertEqual(r.returncode, 0, r.stderr)
    return json.loads(r.stdout.splitlines()[-1]), r


class WithoutTorch(unittest.TestCase):
    def test_program_without_torch_is_untouched(self):
        seen, r = probe(self, "import os, json")
        self.assertEqual(seen, {"lib_mapped": False, "ctypes": False, "gradd": False, "watching": True})
        self.assertEqual(r.stderr, "")
        r = run_python("pass")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))

    def test_unset_or_empty_lib_installs_no_hook(self):
        for lib in (None, ""):
            seen, r = probe(self, "", lib=lib)
            self.assertEqual(seen, {"lib_mapped": False, "ctypes": False, "gradd": False, "watching": False}, lib)
            self.assertEqual(r.stderr, "")


class UserSitecustomize(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="gradd-shim-")
        self.user = os.path.join(self.dir.name, "user")
        self.mark = os.path.join(self.dir.name, "mark")
        os.mkdir(self.user)

    def tearDown(self):
        self.dir.cleanup()

    def write_user_site(self, text):
        with open(os.path.join(self.user, "sitecustomize.py"), "w") as f:
            f.write(text)

    def test_user_sitecustomize_runs_once(self):
        self.write_user_site("import os\nopen(%r, 'a').write('ran\\n')\nVALUE = 42\n" % self.mark)
        # Also a second copy of the shim's directory and an entry with no
        # sitecustomize between the shim and the user's.
        empty = os.path.join(self.dir.name, "empty")
        os.mkdir(empty)
        code = ("import sitecustomize, importlib; importlib.import_module('sitecustomize')\n"
                "print(sitecustomize.VALUE, sitecustomize.__file__)")
        for lib in (LIB, None):
            if os.path.exists(self.mark):
                os.unlink(self.mark)
            r = run_python(code, lib=lib, path=(SHIM, empty, self.user))
            self.assertEqual((r.returncode, r.stderr), (0, ""))
            self.assertEqual(r.stdout, "42 %s\n" % os.path.join(self.user, "sitecustomize.py"))
            with open(self.mark) as f:
                self.assertEqual(f.read(), "ran\n", lib)

    def test_user_sitecustomize_error_reported_as_python_does(self):
        self.write_user_site("raise ValueError('boom in the user site')\n")
        code = "print('carried on')"
        plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/",
                               env=dict(child_env(lib=None), PYTHONPATH=self.user))
        self.assertEqual(plain.stderr, "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                         "ValueError: boom in the user site\n")
        r = run_python(code, path=(self.user,))
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "carried on\n", plain.stderr))

    @unittest.skipUnless(TORCH, NO_TORCH)
    def test_user_sitecustomize_importing_torch_gets_the_allocator(self):
        self.write_user_site("import torch\n")
        seen, r = probe(self, "", path=(self.user,))
        self.assertEqual(r.stderr, "")
        self.assertTrue(seen["installed"] and all(seen["served"]), seen)
        self.assertFalse(seen["watching"])


@unittest.skipUnless(TORCH, NO_TORCH)
class ImportTorch(unittest.TestCase):
    def test_import_torch_installs_before_the_next_statement(self):
        for first in ("import torch", "from torch import nn", "import torch.cuda.memory"):
            seen, r = probe(self, first + "\nnext_statement = probe()\nprint(json.dumps(next_statement))")
            self.assertEqual(r.stderr, "", first)
            right_after = json.loads(r.stdout.splitlines()[0])
            for got in (right_after, seen):
                self.assertEqual(got, {"lib_mapped": True, "ctypes": True, "gradd": True, "watching": False,
                                       "served": [True] * 6, "installed": True,
                                       "torch_loader": "SourceFileLoader", "spec_loader": "SourceFileLoader"},
                                 first)

    def test_missing_library_one_line_and_torch_untouched(self):
        missing = "/nonexistent/libgradd-alloc.so"
        seen, r = probe(self, "import torch\nprint(torch.ones(3).sum().item())", lib=missing)
        self.assertEqual(r.stdout.splitlines()[0], "3.0")
        self.assertEqual(seen["served"], [False] * 6)
        self.assertFalse(seen["installed"])
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertTrue(r.stderr.startswith("gradd: cannot use GRADD_ALLOC_LIB=%s: %s: cannot open shared object "
                                            "file" % (missing, missing)), r.stderr)
        self.assertTrue(r.stderr.endswith(TAIL), r.stderr)

    def test_relative_library_path_refused(self):
        r = run_python("import torch; print('carried on')", lib="libgradd-alloc.so")
        self.assertEqual((r.returncode, r.stdout), (0, "carried on\n"))
        self.assertEqual(r.stderr, "gradd: GRADD_ALLOC_LIB=libgradd-alloc.so is not an absolute path" + TAIL)

    def test_library_refusing_its_environment_is_quoted(self):
        cases = (({"GRADD_ALLOC_BACKEND": "gpu"}, "gradd allocator: GRADD_ALLOC_BACKEND=gpu: expected cuda or cpu"),
                 ({"GRADD_ALLOC_LIMIT": "lots"}, "gradd allocator: GRADD_ALLOC_LIMIT=lots: "))
        for env, quoted in cases:
            seen, r = probe(self, "import torch", **env)
            self.assertFalse(seen["installed"])
            self.assertEqual(seen["served"], [False] * 6)
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
            self.assertTrue(r.stderr.startswith("gradd: " + quoted) and r.stderr.endswith(TAIL), r.stderr)

    def test_cpu_only_torch_keeps_its_allocator(self):
        if TORCH["cuda"] is not None:
            self.skipTest("this torch is built with CUDA")
        # Not test mode: the real plug-in, which a CPU-only build cannot take.
        seen, r = probe(self, "import torch", GRADD_ALLOC_BACKEND="")
        self.assertEqual(r.stderr, "gradd: this PyTorch (%s) is built without CUDA" % TORCH["version"] + TAIL)
        self.assertFalse(seen["installed"])
        self.assertEqual(seen["served"], [False] * 6)

if __name__ == "__main__":
    unittest.main(verbosity=2)
