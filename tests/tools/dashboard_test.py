#!/usr/bin/python3
"""The dashboard during a job and after it, as a person sees it: `dsgd train` (2 workers and a
standby, the CNN on synthetic images) serves it with --metrics-port and writes its history with
--metrics-dir; one worker is held to 60% of the time until it is named a straggler, another is
killed (a standby takes its place). Headless Chromium opens the live page and the page of the
finished job (`dsgd dashboard --metrics-dir`), and the charts' data (the page's #chart-data) must
show the training curve, a validation point, the recovery and the straggler. Saves screenshots of
both pages in OUT_DIR.

  /usr/bin/python3 tests/tools/dashboard_test.py DSGD_BINARY OUT_DIR
"""
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from worker_processes import throttle, worker_pids  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def history(port):
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/history.json", timeout=5).read())


def wait_for(what, check, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"FAIL: {what} within {seconds} s")


def chromium(url, out_dir, name):
    """The page after its script ran: the charts' data, and a screenshot."""
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--virtual-time-budget=10000", "--window-size=1400,1100"]
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(base + [f"--user-data-dir={profile}", "--dump-dom", url], capture_output=True,
                             text=True, timeout=120)
    m = re.search(r'<pre id="chart-data"[^>]*>(.*?)</pre>', dom.stdout, re.S)
    if not m or not m.group(1).strip():
        sys.exit(f"FAIL: no chart data in {url}: {dom.stdout[-2000:]} {dom.stderr[-2000:]}")
    shot = os.path.join(out_dir, name)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(base + [f"--user-data-dir={profile}", f"--screenshot={shot}", url], capture_output=True,
                       timeout=120)
    if not os.path.exists(shot) or os.path.getsize(shot) < 20000:
        sys.exit(f"FAIL: no screenshot of {url} in {shot}")
    return json.loads(html.unescape(m.group(1)))


def main():
    binary, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    port = free_port()
    metrics_dir = tempfile.mkdtemp(prefix="dsgd-dashboard-")
    job = subprocess.Popen([binary, "train", "--workers", "2", "--standby", "1", "--model", "cnn", "--dataset",
                            "synthetic", "--synthetic-samples", "40000", "--epochs", "4", "--batch-size", "64",
                            "--threads", "1", "--no-dropout", "--checkpoint-every", "20",
                            "--metrics-port", str(port), "--metrics-dir", metrics_dir, "-q"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("training points", lambda: len(history(port)["train"]) >= 3, 90)
        victim = worker_pids(job.pid)[1]  # started second: rank 1 (the standby came third)
        stop = threading.Event()
        slowing = threading.Thread(target=throttle, args=(victim, 0.6, stop))
        slowing.start()
        try:
            wait_for("a straggler named", lambda: any(e["kind"] == "straggler" for e in history(port)["events"]), 60)
        finally:
            stop.set()
            slowing.join()
            os.kill(victim, signal.SIGCONT)
        os.kill(worker_pids(job.pid)[0], signal.SIGKILL)
        wait_for("a recovery", lambda: any(e["kind"] == "recovery" for e in history(port)["events"]), 60)
        wait_for("a validation point", lambda: history(port)["validation"], 120)
        live = chromium(f"http://127.0.0.1:{port}/", out_dir, "dashboard-live.png")
        print("live page:", live)
        assert live["train_points"] >= 3 and live["speed_points"] == live["train_points"], live
        assert live["validation_points"] >= 1 and live["recovery_markers"] >= 1, live
        assert live["stragglers"] >= 1 and live["bars"] == 2 and not live["ended"], live
    finally:
        job.send_signal(signal.SIGINT)  # Ctrl-C: the job stops and its driver writes the last history
        try:
            out, err = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
    # Stopped, it still says what it did: the steps so far and the recovery, though its epoch had not ended.
    assert job.returncode == 130, (job.returncode, err[-2000:])
    summary = json.loads(out)
    assert summary["interrupted"] and summary["steps"] > 0, summary
    assert [r["kind"] for r in summary["recoveries"]] == ["recovery"], summary["recoveries"]
    with open(os.path.join(metrics_dir, "history.json")) as f:
        assert json.load(f)["ended"], "the history of a stopped job does not say it ended"
    port2 = free_port()
    viewer = subprocess.Popen([binary, "dashboard", "--metrics-dir", metrics_dir, "--port", str(port2)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("dsgd dashboard", lambda: history(port2)["ended"], 30)
        after = chromium(f"http://127.0.0.1:{port2}/", out_dir, "dashboard-after.png")
        print("after the job:", after)
        assert after["ended"] and after["train_points"] >= live["train_points"], after
        assert after["recovery_markers"] >= 1 and after["stragglers"] >= 1 and after["validation_points"] >= 1, after
    finally:
        viewer.send_signal(signal.SIGINT)
        viewer.wait(timeout=30)
    assert viewer.returncode == 0, viewer.stderr.read()
    shutil.rmtree(metrics_dir)
    print("PASS: the dashboard shows the job's curves, its recovery and its straggler, live and afterwards")


if __name__ == "__main__":
    main()
