"""The one helper of the bench scripts' tests (test_*.py beside it): a failed check is
printed and recorded, and the test goes on, so one run lists every failure; finish()
ends the run, exit status 1 if any check failed."""
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def finish():
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")
