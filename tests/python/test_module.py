"""The dsgd Python module (python/): a model defined in Python, trained by dsgd's C++ workers.

ctest runs these with PYTHONPATH=build/python (tests/CMakeLists.txt).
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import dsgd  # noqa: E402
import scripted_models  # noqa: E402
from worker_processes import throttle, worker_pids  # noqa: E402

SMALL = dict(data="synthetic", synthetic_samples=2048, batch_size=64, threads_per_worker=1, dropout=False)


def test_a_python_model_trains_and_comes_back_as_a_script_module():
    torch.manual_seed(0)
    with dsgd.Trainer(model=scripted_models.Cnn(dropout=False), num_workers=2, lr=0.01, **SMALL) as t:
        before = {k: v.clone() for k, v in t.get_model().state_dict().items()}
        first = t.train(num_steps=10)
        assert first["batches"] == 10 and first["epoch"] == 0 and first["batch"] == 10
        assert 0 <= first["accuracy"] <= 1 and first["loss"] > 0
        assert set(t.validate()) >= {"loss", "accuracy", "num_samples"}
        after = t.get_model()
        assert isinstance(after, torch.jit.ScriptModule)
        assert list(after.state_dict()) == list(before), "Python's parameter names"
        moved = max(float((after.state_dict()[k] - before[k]).abs().max()) for k in before)
        assert moved > 1e-4, "training moved the weights"


def test_foreach_model_visits_every_replica_of_every_worker_and_foreach_worker_the_first():
    with dsgd.Trainer(model="cnn", num_workers=2, devices_per_worker=2, **SMALL) as t:
        t.train(num_steps=2)
        models = t.foreach_model("dsgd.replica")
        assert [(m["rank"], m["worker"], m["local_replica"]) for m in models] == \
            [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
        assert len({m["checksum"] for m in models}) == 1, "the replicas hold one set of parameters"
        assert [w["rank"] for w in t.foreach_worker("dsgd.replica")] == [0, 2]
        with pytest.raises(Exception, match="no worker function 'nothing'"):
            t.foreach_model("nothing")


def test_settings_are_trainer_config_fields_by_their_cpp_names():
    with dsgd.Trainer(model="cnn", num_workers=1, step={"max_grad_norm": 0.5},
                      recovery_heartbeat_timeout=5000, **SMALL) as t:
        assert t.settings["step"] == {"max_grad_norm": 0.5}
        assert t.settings["recovery.heartbeat_timeout"] == 5000
        assert "grad_norm" in t.train(num_steps=2), "clipping on: the norm is reported"
    assert "step.zero_stage" in dsgd.setting_names()


@pytest.mark.parametrize("keywords, message", [
    (dict(num_workers=0), "num_workers must be in 1..4096, got 0"),
    (dict(step={"max_grad_norm": "high"}), 'step.max_grad_norm must be a number, got "high"'),
    (dict(strategy="gossip"), "unknown strategy 'gossip'"),
    (dict(colour="red"), "unknown image classifier config key 'colour'"),
    (dict(model="/nonexistent/net.pt"), "model file '/nonexistent/net.pt' not found"),
    (dict(loss="hinge"), "unknown loss 'hinge'; use cross_entropy, nll, mse or a TorchScript file"),
    (dict(optimizer="adagrad"), "optimizer 'adagrad': dsgd's workers run sgd, adam, adamw or rmsprop"),
    (dict(optimizer=torch.optim.LBFGS), "optimizer 'LBFGS'"),
    (dict(beta1=1.5), "beta1 must be in [0, 1), got 1.5"),
    (dict(data=(torch.zeros(4, 3), torch.zeros(4))), "data: x must be floating point [N, ...] and y integer labels"),
    (dict(data={"training": (torch.zeros(4, 3), torch.zeros(4).long())}), "data: a dict holds 'train'"),
])
def test_a_bad_argument_raises_a_value_error_naming_it(keywords, message):
    with pytest.raises(dsgd.ConfigError) as e:
        dsgd.Trainer(**{**SMALL, **keywords})
    assert isinstance(e.value, ValueError)
    assert message in str(e.value)


def trained_with(loss, steps=10):
    torch.manual_seed(0)
    with dsgd.Trainer(model=scripted_models.Cnn(dropout=False), num_workers=2, loss=loss, **SMALL) as t:
        r = t.train(num_steps=steps)
        return r["loss"], t.get_model().state_dict()


def test_a_loss_from_python_trains_as_the_built_in_one_it_equals():
    loss, params = trained_with(None)
    scripted_loss, scripted_params = trained_with(torch.nn.CrossEntropyLoss())
    assert scripted_loss == pytest.approx(loss, rel=1e-6)
    assert max(float((params[k] - scripted_params[k]).abs().max()) for k in params) < 1e-6
    smoothed, _ = trained_with(torch.nn.CrossEntropyLoss(label_smoothing=0.2))
    assert smoothed != pytest.approx(loss, rel=1e-3), "the module's own settings count"
    mse, _ = trained_with("mse")
    assert 0 < mse < loss, "mse against one-hot targets: a different, smaller number"


def rows(n=256, features=20, classes=4, seed=0):
    """Feature rows [n, features] labelled by a random linear teacher: data that are not images."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return x, (x @ torch.randn(features, classes, generator=g)).argmax(1)


@pytest.mark.parametrize("optimizer, options", [
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99))),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
])
def test_tensors_and_an_optimizer_from_python_train_as_pytorch_does(optimizer, options):
    """Full batches, so the order of samples does not count: dsgd's two workers average their
    halves' gradients and step as torch.optim does on the whole batch."""
    x, y = rows()
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    reference = {k: v.clone() for k, v in net.state_dict().items()}
    with dsgd.Trainer(model=net, data=(x, y), optimizer=optimizer, num_workers=2, batch_size=len(x),
                      threads_per_worker=1, **options) as t:
        for _ in range(10):
            assert t.train()["batches"] == 1, "an epoch: one full batch"
        trained = t.get_model().state_dict()
    net.load_state_dict(reference)
    step = optimizer(net.parameters(), **options)
    for _ in range(10):
        step.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        step.step()
    difference = max(float((trained[k] - v).abs().max()) for k, v in net.state_dict().items())
    moved = max(float((reference[k] - v).abs().max()) for k, v in net.state_dict().items())
    print(f"{optimizer.__name__}: weights moved {moved:.3g}; dsgd and PyTorch differ by {difference:.3g}")
    assert moved > 1e-2 and difference < 1e-5


def test_fit_returns_the_run_summary_and_calls_back_each_epoch():
    x, y = rows(n=600)
    seen = []
    with dsgd.Trainer(model=torch.nn.Sequential(torch.nn.Linear(20, 4)), optimizer="adamw", lr=0.02,
                      data=torch.utils.data.TensorDataset(x[:512], y[:512]), num_workers=2, batch_size=64,
                      threads_per_worker=1) as t:
        r = t.fit(epochs=2, on_epoch=seen.append)
    assert r["epochs"] == 2 and r["steps"] == 16 and r["samples"] == 1024
    assert [e["epoch"] for e in r["history"]] == [1, 2] and seen == r["history"]
    assert r["test_accuracy"] == -1, "no validation split given"
    assert r["history"][1]["train_loss"] < r["history"][0]["train_loss"] and r["recoveries"] == []
    with dsgd.Trainer(model=torch.nn.Sequential(torch.nn.Linear(20, 4)), optimizer="adam", lr=0.05,
                      data={"train": (x[:512], y[:512]), "validation": (x[512:], y[512:])}, num_workers=2,
                      batch_size=64, threads_per_worker=1) as t:
        r = t.fit(epochs=3)
    assert r["test_accuracy"] == r["history"][-1]["test_accuracy"] > 0.8, r


def test_a_callback_that_raises_stops_the_job():
    x, y = rows()

    def stop(epoch):
        raise RuntimeError("enough")
    with dsgd.Trainer(model=torch.nn.Linear(20, 4), data=(x, y), num_workers=2, threads_per_worker=1) as t:
        pids = worker_pids()
        with pytest.raises(RuntimeError, match="enough"):
            t.fit(epochs=3, on_epoch=stop)
        time.sleep(0.5)
        assert len(pids) == 2 and not set(pids) & set(worker_pids()), "the workers stopped"


@pytest.mark.parametrize("tensors, message", [
    (dict(train_x=torch.zeros(4, 3), test_x=torch.zeros(2, 3)), "no 'train_y' tensor"),
    ([torch.zeros(4, 3), torch.zeros(4)], "holds a GenericList; torch.save a dict"),
    (dict(train_x=torch.zeros(4, 3), train_y=torch.zeros(3).long()), "'train_y' has 3 labels for 4 samples"),
])
def test_a_bad_tensors_file_fails_the_job_naming_the_file_and_the_key(tmp_path, tensors, message):
    torch.save(tensors, tmp_path / "data.pt")
    with pytest.raises(dsgd.Error) as e:
        dsgd.Trainer(model=torch.nn.Linear(3, 2), data=tmp_path / "data.pt", num_workers=1, threads_per_worker=1)
    assert str(tmp_path / "data.pt") in str(e.value) and message in str(e.value)


def test_a_reference_model_on_data_that_are_not_images_is_refused():
    with pytest.raises(dsgd.Error, match=r"model 'cnn' takes square images \[N, C, H, H\]; the data's samples "
                                         r"are \[256, 20\]"):
        dsgd.Trainer(model="cnn", data=rows(), num_workers=1, threads_per_worker=1)


def test_tune_searches_over_a_python_model_and_names_the_best(tmp_path):
    space = {"lr": {"grid": [0.001, 0.05]}}
    r = dsgd.tune(space, tmp_path / "search", model=scripted_models.Cnn(dropout=False), num_trials=1,
                  max_iterations=2, steps_per_iteration=5, num_workers=1, **SMALL)
    assert [t["state"] for t in r["trials"]] == ["done", "done"]
    assert sorted(t["params"]["lr"] for t in r["trials"]) == [0.001, 0.05]
    assert r["best"]["params"] == max(r["trials"], key=lambda t: t["last"])["params"]
    assert (tmp_path / "search" / "model.pt").exists()
    assert torch.jit.load(os.path.join(r["best"]["checkpoint"], "model.pt")) is not None


def test_a_killed_worker_is_recovered_and_listed_in_the_results():
    with dsgd.Trainer(model=scripted_models.Cnn(dropout=False), num_workers=2, recovery_standby_workers=1,
                      checkpoints_every_steps=5, **SMALL) as t:
        t.train(num_steps=3)
        victim = worker_pids()[1]
        killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
        killer.start()
        r = t.fit(epochs=1, max_steps=25)
        killer.join()
        assert r["steps"] == 25 and r["history"][0]["recoveries"] == 1
        assert len(r["recoveries"]) == 1, r["recoveries"]
        assert f"pid {victim}" in r["recoveries"][0]["lost"]
        assert r["recoveries"][0]["standbys_used"] == 1


def test_ctrl_c_stops_the_job_leaving_no_process_and_no_shared_memory(tmp_path):
    mark = uuid.uuid4().hex  # in every process the job starts: their environment is inherited
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import dsgd, scripted_models
        t = dsgd.Trainer(model=scripted_models.Cnn(), num_workers=2, data="synthetic", batch_size=64,
                         threads_per_worker=1, synthetic_samples=200000)
        print("training", flush=True)
        t.train()
        print("finished", flush=True)
    """))
    shm_before = set(os.listdir("/dev/shm"))
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**os.environ, "DSGD_TEST_MARK": mark}, text=True)
    assert job.stdout.readline().strip() == "training"
    time.sleep(2)
    assert len(worker_pids(job.pid)) == 2
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=60)
    assert job.returncode != 0
    assert "KeyboardInterrupt" in err, err[-2000:]
    time.sleep(0.5)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"DSGD_TEST_MARK={mark}".encode() in f.read():
                    left.append(pid)
        except OSError:
            pass
    assert left == [], "processes left behind"
    assert [s for s in set(os.listdir("/dev/shm")) - shm_before if "dsgd" in s] == []


def test_a_language_model_from_python_learns_text(tmp_path):
    with open(tmp_path / "corpus.txt", "w") as f:
        f.writelines(f"line {i * 37 % 100} of a small corpus\n" for i in range(600))
    prep = subprocess.run([os.environ.get("DSGD_BINARY", "build/dsgd"), "prepare-text", "--input",
                           str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "tok"), "--val-fraction", "0.1"],
                          capture_output=True, text=True, timeout=120)
    assert prep.returncode == 0, prep.stderr
    with pytest.raises(dsgd.ConfigError, match="'context' must be given for a model from a file"):
        dsgd.Trainer(model=scripted_models.TinyLm(context=32), data=f"text:{tmp_path / 'tok'}", num_workers=1)
    torch.manual_seed(0)
    with dsgd.Trainer(model=scripted_models.TinyLm(context=32), data=f"text:{tmp_path / 'tok'}", context=32,
                      num_workers=2, batch_size=8, lr=3e-3, warmup_steps=5, threads_per_worker=1) as t:
        before = t.validate()["loss"]
        r = t.fit(epochs=1, max_steps=40)
        lm = t.get_model()
    print(f"validation loss {before:.3f} -> {r['test_loss']:.3f} after {r['steps']} steps")
    assert r["steps"] == 40 and r["test_loss"] < 0.6 * before, r
    tokens = torch.randint(0, 256, (1, 32))
    assert lm(tokens).shape == (1, 32, 256), "the trained module comes back as a ScriptModule"


def test_a_worker_slowed_by_a_known_amount_is_named_a_straggler_and_cleared():
    """Two workers at pace for 15 s: nobody named. One held to 70% of the time: named within 30 s
    as about 1/0.7 = 1.43x slower; let go, cleared."""
    with dsgd.Trainer(model="cnn", num_workers=2, data="synthetic", synthetic_samples=500000, batch_size=64,
                      threads_per_worker=1, dropout=False) as t:
        def train_for(seconds, until=lambda r: False):
            start, results = time.monotonic(), []
            while time.monotonic() - start < seconds:
                results.append(t.train(num_steps=100))
                if until(results[-1]):
                    break
            return time.monotonic() - start, results
        _, steady = train_for(15)
        assert [s for r in steady for s in r["stragglers"]] == [], "nobody stands out at a steady pace"
        victim = worker_pids()[1]
        stop, achieved = threading.Event(), {}
        slowing = threading.Thread(target=throttle, args=(victim, 0.7, stop, achieved))
        slowing.start()
        try:
            took, slowed = train_for(45, until=lambda r: r["stragglers"])
            train_for(11)  # a whole window at 70%: its slowdown shows in full
        finally:
            stop.set()
            slowing.join()
            os.kill(victim, signal.SIGCONT)
        named = slowed[-1]["stragglers"]
        print(f"named after {took:.1f} s: {named}")
        assert took < 30 and len(named) == 1, named
        assert named[0]["pid"] == victim and named[0]["rank"] == 1 and named[0]["to_step"] == -1
        _, recovered = train_for(45, until=lambda r: r["stragglers"] and r["stragglers"][0]["to_step"] > 0)
        cleared = recovered[-1]["stragglers"]
        print(f"cleared: {cleared}")
        assert len(cleared) == 1 and cleared[0]["to_step"] > cleared[0]["from_step"] == named[0]["from_step"]
        # The slowdown is the worst window's: about 1 / share, the share the throttle achieved (0.7 asked;
        # less where the machine is loaded and its sleeps overshoot), up to a quarter more: the worst of noisy windows.
        expected = 1 / achieved["share"]
        print(f"share achieved {achieved['share']:.3f}: expected slowdown {expected:.2f}")
        assert 1.3 < cleared[0]["slowdown"] < 1.25 * expected, (cleared[0]["slowdown"], expected)


def test_a_straggler_is_evicted_and_a_ready_standby_takes_its_place():
    """recovery.on_straggler evict: a worker held to 60% of the time is named, evicted (its process
    ends) and the standby takes its place: two workers go on, the summary says why."""
    with dsgd.Trainer(model="cnn", num_workers=2, data="synthetic", synthetic_samples=500000, batch_size=64,
                      threads_per_worker=1, dropout=False,
                      recovery={"standby_workers": 1, "on_straggler": "evict"}) as t:
        t.train(num_steps=50)
        victim = sorted(worker_pids())[1]  # started second: rank 1 (the standby came third)
        stop = threading.Event()
        slowing = threading.Thread(target=throttle, args=(victim, 0.6, stop))
        slowing.start()
        start, results = time.monotonic(), []
        try:
            while time.monotonic() - start < 60 and not (results and results[-1]["recoveries"]):
                results.append(t.train(num_steps=100))
        finally:
            stop.set()
            slowing.join()
            if os.path.exists(f"/proc/{victim}"):
                os.kill(victim, signal.SIGCONT)
        took = time.monotonic() - start
        r = results[-1]
        print(f"after {took:.1f} s: stragglers {r['stragglers']}, recoveries {r['recoveries']}")
        assert len(r["recoveries"]) == 1, r["recoveries"]
        ev = r["recoveries"][0]
        assert "evicted as a straggler" in ev["failure"] and f"pid {victim}" in ev["lost"], ev
        assert ev["standbys_used"] == 1 and ev["workers_after"] == 2, ev
        named = [s for s in r["stragglers"] if s["pid"] == victim]
        assert len(named) == 1 and named[0]["evicted"] and named[0]["to_step"] >= named[0]["from_step"], named
        for _ in range(50):
            if not os.path.exists(f"/proc/{victim}") or open(f"/proc/{victim}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the evicted worker's process lives on")
        after = t.train(num_steps=100)
        assert after["recoveries"] == [] and after["batches"] == 100, after
