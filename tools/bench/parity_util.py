"""What the parity scripts (deeplab_parity.py, nasnet_parity.py) share: running the engine on a batch file.

engine_losses(engine, model_flags, weights, batch, device, n) runs `engine_train MODEL_FLAGS --batch N --load WEIGHTS
--batch-file BATCH --steps 2 --device DEVICE` and returns its two losses (the 10-digit "  loss X" lines that
--batch-file prints), the command line and the seconds it took; it exits naming the command when the engine fails.
"""
import re
import subprocess
import sys
import time


def engine_losses(engine, model_flags, weights, batch, device, n):
    cmd = [engine, *model_flags, "--batch", str(n), "--load", weights, "--batch-file", batch, "--steps", "2",
           "--device", device]
    t0 = time.time()
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"engine failed ({' '.join(cmd)}):\n{run.stdout}\n{run.stderr}")
    losses = [float(x) for x in re.findall(r"^  loss (\S+)$", run.stdout, re.M)]
    if len(losses) != 2:
        sys.exit(f"expected two '  loss X' lines from the engine, got:\n{run.stdout}")
    return losses, " ".join(cmd), time.time() - t0
