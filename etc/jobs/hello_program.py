"""The program of etc/jobs/hello-program.cfg: what a gradd program job
sees, then a few "steps" that a SIGTERM (gradctl cancel) ends cleanly."""
import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
print(os.environ.get("GREETING", "hello"))
print("job %s, uid %d, in %s, CUDA_VISIBLE_DEVICES=%r" % (os.environ.get("GRADD_JOB_ID"), os.getuid(), os.getcwd(),
                                                          os.environ.get("CUDA_VISIBLE_DEVICES")))
for step in range(1, args.steps + 1):
    if stop:
        print("stopping at step %d: SIGTERM" % step)
        sys.exit(0)
    print("step %d/%d" % (step, args.steps))
    time.sleep(0.1)
