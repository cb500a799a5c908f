# ember code-interpreter driver: one persistent Python process per context.
# The agent passes this file with `python3 -u -c` (nothing is written into the
# sandbox). Protocol: one JSON request per line on stdin ({"code": ...}); one
# JSON event per line on the original stdout; raw writes to fd 1 and 2 (child
# processes, C extensions) go to the agent as stderr.
import ast, json, os, signal, sys, traceback

_proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
_requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
os.dup2(2, 1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)


def _emit(**event):
    _proto.write(json.dumps(event) + "\n")
    _proto.flush()


class _Stream:
    """sys.stdout / sys.stderr: whole lines become events; a partial line is
    held until its newline or the end of the cell."""

    def __init__(self, kind):
        self.kind, self.buf = kind, ""
        self.encoding, self.errors = "utf-8", "replace"

    def write(self, text):
        text = str(text)
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            _emit(type=self.kind, text=line + "\n")
        return len(text)

    def flush(self):
        if self.buf:
            _emit(type=self.kind, text=self.buf)
            self.buf = ""

    def isatty(self):
        return False

    def fileno(self):
        return 1 if self.kind == "stdout" else 2

    def writable(self):
        return True


sys.stdout, sys.stderr = _Stream("stdout"), _Stream("stderr")
sys.stdin = open(os.devnull)
_globals = {"__name__": "__main__", "__builtins__": __builtins__}
_count = 0
_running = False


def _on_sigint(signum, frame):
    # An interrupt stops the running cell; between cells it is ignored.
    if _running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)
_emit(type="ready")
for _line in _requests:
    _count += 1
    _emit(type="execution_count", execution_count=_count)
    _running = True
    try:
        _code = json.loads(_line)["code"]
        _tree = ast.parse(_code, "<cell>", "exec")
        _last = None
        if _tree.body and isinstance(_tree.body[-1], ast.Expr):
            _last = ast.Expression(_tree.body.pop().value)
        exec(compile(_tree, "<cell>", "exec"), _globals)
        if _last is not None:
            _value = eval(compile(_last, "<cell>", "eval"), _globals)
            if _value is not None:
                _globals["_"] = _value
                sys.stdout.flush()
                _emit(type="result", results={"text": repr(_value)})
    except BaseException as _e:  # noqa: B036 -- the cell's error, reported, not raised
        sys.stdout.flush()
        sys.stderr.flush()
        _tb = traceback.format_exception(type(_e), _e, _e.__traceback__.tb_next if _e.__traceback__ else None)
        _emit(type="error", ename=type(_e).__name__, evalue=str(_e), traceback=[t.rstrip("\n") for t in _tb])
    _running = False
    sys.stdout.flush()
    sys.stderr.flush()
    _emit(type="done")
