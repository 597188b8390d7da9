"""What the package's tests share: a Reporter that keeps its reports."""


class FakeReporter:
    """Stands in for gradd._client.Reporter: each report as a tuple
    (micro, accum, step, change_from, change_to, reason, loss)."""

    def __init__(self):
        self.calls = []

    def report(self, micro, accum, step=0, change_from=0, change_to=0, reason="", loss=None):
        self.calls.append((micro, accum, step, change_from, change_to, reason, loss))
        return True

    def changes(self):
        """(from, to, reason, step) of each change reported."""
        return [(c[3], c[4], c[5], c[2]) for c in self.calls if c[5]]
