"""dsgd from Python: a model defined in Python, trained by dsgd's C++ worker processes.

    import torch, dsgd
    net = MyNet()                                   # any torch.nn.Module that TorchScript can script
    with dsgd.Trainer(model=net, data="fashion-mnist", num_workers=2, batch_size=128, lr=0.01) as t:
        for epoch in range(3):
            print(t.train(), t.validate())          # dicts: loss, accuracy, num_samples, recoveries, ...
        t.save("ckpt")                              # ckpt/model.pt: torch.jit.load reads it
        trained = t.get_model()                     # a torch.jit.ScriptModule with the trained weights

The model is scripted (torch.jit.script; pass a ScriptModule to choose tracing yourself) and saved
to a file every worker reads: the workers run no Python. Keywords are TrainerConfig's fields, named
as in C++ (num_workers, strategy, batch_size, step={"max_grad_norm": 1.0} or step_max_grad_norm,
recovery={"standby_workers": 1}, ...; dsgd.setting_names() lists them), and the operator's own
settings (lr, momentum, lr_decay, dropout, data_dir, ...). A bad one raises dsgd.ConfigError (a
ValueError) naming it; other failures raise dsgd.Error. The GIL is released while the workers train;
Ctrl-C raises KeyboardInterrupt and stops every worker.
"""
import atexit
import io
import json
import os
import tempfile
import weakref

from ._core import ConfigError, Error, TimeoutError, setting_names  # noqa: F401
from . import _core

__all__ = ["Trainer", "tune", "Error", "ConfigError", "TimeoutError", "setting_names"]

_GROUPS = tuple(_core.setting_groups())  # step, comm, ps, ...: from the one settings table
_live = weakref.WeakSet()


@atexit.register
def _stop_all():
    for t in list(_live):
        t.shutdown()


def _settings(keywords):
    """Splits keywords into TrainerConfig settings and the operator's config."""
    names = set(setting_names())
    settings, config = {}, {}
    for key, value in keywords.items():
        if key == "config":  # the operator's config as one dict, as in C++
            config.update(value)
            continue
        dotted = key.replace("_", ".", 1) if key.split("_", 1)[0] in _GROUPS else key
        if key in names or key in _GROUPS:
            settings[key] = value
        elif dotted in names:
            settings[dotted] = value  # step_max_grad_norm -> step.max_grad_norm
        else:
            config[key] = value
    return settings, config


class Trainer:
    """Trains `model` on `data` with dsgd's workers (see the module's docstring).

    model: a torch.nn.Module (scripted here), a torch.jit.ScriptModule, a function that returns
           either, a path to a TorchScript file, or a reference model's name ("cnn", the default,
           "mlp", ...; "gpt-tiny", the default on text, up to "gpt-xl": GPT-2's shapes). A language model
           maps tokens [N, T] to logits [N, T, vocab]; give its context= (T).
    data:  tensors: (x, y) with x [N, ...] floating point and y [N] class labels, a
           torch.utils.data.TensorDataset of the two, or {"train": (x, y), "validation": (x, y)};
           "fashion-mnist" or "synthetic" (images); "text:DIR" with a gpt-* model; or a file
           torch.save'd as {"train_x": x, "train_y": y, "test_x": ..., "test_y": ...}.
    loss:  "cross_entropy" (the default), "nll", "mse", or a torch.nn.Module whose
           forward(output, target) returns the loss (scripted here, e.g. nn.CrossEntropyLoss(
           label_smoothing=0.1)).
    optimizer: "sgd" (the default, with momentum), "adam", "adamw" or "rmsprop", or torch.optim.SGD,
           Adam, AdamW, RMSprop themselves; their settings as keywords: lr, momentum, weight_decay, betas.
    """

    def __init__(self, model=None, data="fashion-mnist", loss=None, optimizer=None, **keywords):
        self._core = None
        self._dir = tempfile.TemporaryDirectory(prefix="dsgd-")
        operator, self.settings = _job(model, data, loss, optimizer, keywords, self._dir.name)
        self._core = _core.Trainer(operator, json.dumps(self.settings))
        _live.add(self)

    def train(self, num_steps=0, profile=False):
        """One epoch (or num_steps global batches): metrics averaged over batches and workers,
        the position (epoch, batch), the recoveries of the call and the stragglers named in it
        (rank, host, pid, slowdown, from_step, to_step: -1 while still slow)."""
        return json.loads(self._trainer().train(num_steps, profile))

    def validate(self):
        return json.loads(self._trainer().validate())

    def fit(self, epochs=1, max_steps=0, evaluate=True, profile=False, on_epoch=None):
        """Trains `epochs` epochs (or max_steps steps in all) from where the Trainer is, validating
        after each; returns the run's summary as `dsgd train --json-out` writes it: test_accuracy,
        train_loss, steps, samples_per_s, "history" (a dict per epoch), "recoveries" (every worker
        lost and how it was recovered), ... `on_epoch(dict)` is called after each epoch; an
        exception it raises stops the job, as Ctrl-C does."""
        return json.loads(self._trainer().fit(epochs, max_steps, evaluate, profile, on_epoch))

    def foreach_worker(self, name, arg=None):
        """Runs the worker function `name` (registered in the workers' binary; built in:
        "dsgd.replica") with `arg` on each worker's first replica: a result per worker."""
        return json.loads(self._trainer().foreach(name, json.dumps(arg), False))

    def foreach_model(self, name, arg=None):
        """The same on every replica of every worker, in rank order (devices_per_worker of each)."""
        return json.loads(self._trainer().foreach(name, json.dumps(arg), True))

    def save(self, path):
        self._trainer().save(os.fspath(path))

    def load(self, path):
        self._trainer().load(os.fspath(path))

    def get_model(self):
        """The trained model: a torch.jit.ScriptModule for a model from Python, a name -> tensor
        dict (a state dict) for a reference model."""
        import torch
        data = io.BytesIO(self._trainer().model_bytes())
        try:
            return torch.jit.load(data)
        except RuntimeError:
            data.seek(0)
            return torch.load(data)

    def shutdown(self):
        if self._core is not None:
            self._core.shutdown()
            self._core = None
        self._dir.cleanup()

    def _trainer(self):
        if self._core is None:
            raise ConfigError("this Trainer was shut down; make a new one")
        return self._core

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # at interpreter exit, modules may be gone
            pass


_TUNE_OPTIONS = ("num_trials", "scheduler", "cores", "metric", "mode", "max_iterations", "steps_per_iteration",
                 "grace_period", "reduction_factor", "perturbation_interval", "quantile", "resample_probability",
                 "seed")


def tune(space, dir, model=None, data="fashion-mnist", loss=None, optimizer=None, **keywords):
    """A hyper-parameter search (dsgd tune): trials as dsgd jobs over `space`, a dict as in
    `dsgd tune --space` ({"lr": {"loguniform": [0.005, 0.2]}, "batch_size": {"choice": [32, 64]}}).

    Keywords: the search's (num_trials, scheduler "fifo"/"asha"/"pbt", metric, mode, max_iterations,
    steps_per_iteration, grace_period, reduction_factor, perturbation_interval, quantile,
    resample_probability, seed, cores), then the jobs' as for Trainer. Everything lives in `dir`
    (the model as dir/model.pt); run again on the same dir, it resumes. Returns the results as a
    dict: "best" (its params, metrics and checkpoint), "trials", ...
    """
    os.makedirs(dir, exist_ok=True)
    options = {k: keywords.pop(k) for k in _TUNE_OPTIONS if k in keywords}
    options["dir"] = os.fspath(dir)
    operator, settings = _job(model, data, loss, optimizer, keywords, os.fspath(dir))
    return json.loads(_core.tune(operator, json.dumps(settings), json.dumps(space), json.dumps(options)))


def _job(model, data, loss, optimizer, keywords, directory):
    """The operator and the settings of a job (models and data saved into `directory`)."""
    settings, config = _settings(keywords)
    text = isinstance(data, str) and data.startswith("text:")
    if model is None:
        model = "gpt-tiny" if text else "cnn"
    config["model"] = _saved(model, directory, "model.pt")
    if loss is not None:
        config["loss"] = _saved(loss, directory, "loss.pt")
    if optimizer is not None:
        config["optimizer"] = _optimizer_name(optimizer)
    if "betas" in config:
        config["beta1"], config["beta2"] = config.pop("betas")
    operator = "image_classifier"
    if not isinstance(data, (str, os.PathLike)):
        data = _saved_tensors(data, os.path.join(directory, "data.pt"))
    if text:
        operator = "language_model"
        if "step.scheduler_step_freq" not in settings and "scheduler_step_freq" not in settings.get("step", {}):
            settings["step.scheduler_step_freq"] = "batch"  # warmup and cosine count steps, as in dsgd train
        config["train_tokens"] = os.path.join(data[5:], "train.tok")
        val = os.path.join(data[5:], "val.tok")
        if os.path.exists(val):
            config["val_tokens"] = val
    else:
        config["dataset"] = os.fspath(data)
    settings["config"] = config
    return operator, settings


def _saved(model, directory, name):
    """A name or path as it is; a module scripted (unless it is a script) and saved."""
    if callable(model) and not _is_module(model):
        model = model()
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    import torch
    if not isinstance(model, torch.jit.ScriptModule):
        model = torch.jit.script(model)
    path = os.path.join(directory, name)
    torch.jit.save(model, path)
    return path


def _optimizer_name(optimizer):
    """"sgd", "adam", "adamw" or "rmsprop", from the name or torch.optim's class."""
    name = optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", repr(optimizer))
    if name.lower() not in ("sgd", "adam", "adamw", "rmsprop"):
        raise ConfigError(f"optimizer {name!r}: dsgd's workers run sgd, adam, adamw or rmsprop "
                          "(torch.optim.SGD, Adam, AdamW, RMSprop)")
    return name.lower()


def _saved_tensors(data, path):
    """(x, y), a TensorDataset or {"train": (x, y), "validation": (x, y)} saved where every
    worker reads it (dsgd/data/datasets.h: load_tensors_file)."""
    import torch

    def pair(value, what):
        value = getattr(value, "tensors", value)  # torch.utils.data.TensorDataset
        if not (isinstance(value, (tuple, list)) and len(value) == 2
                and all(isinstance(t, torch.Tensor) for t in value)):
            raise ConfigError(f"data{what}: give (x, y), two tensors: samples [N, ...] and class labels [N]")
        x, y = value
        if not x.is_floating_point() or y.is_floating_point() or y.dim() != 1 or len(x) != len(y):
            raise ConfigError(f"data{what}: x must be floating point [N, ...] and y integer labels [N]; got "
                              f"{x.dtype} {tuple(x.shape)} and {y.dtype} {tuple(y.shape)}")
        return x.detach().cpu().contiguous(), y.detach().cpu().long().contiguous()

    if isinstance(data, dict):
        unknown = set(data) - {"train", "validation", "test"}
        if unknown or "train" not in data:
            raise ConfigError(f"data: a dict holds 'train' and may hold 'validation'; got {sorted(data)}")
        tensors = dict(zip(("train_x", "train_y"), pair(data["train"], "['train']")))
        held_out = data.get("validation", data.get("test"))
        if held_out is not None:
            tensors.update(zip(("test_x", "test_y"), pair(held_out, "['validation']")))
    else:
        tensors = dict(zip(("train_x", "train_y"), pair(data, "")))
    torch.save(tensors, path)
    return path


def _is_module(obj):
    try:
        import torch
        return isinstance(obj, torch.nn.Module)
    except ImportError:
        return False
