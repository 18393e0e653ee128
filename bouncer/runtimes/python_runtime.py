"""Python models: a handler class in a file, for what no exported graph can hold.

The same split as BentoML's runners and KServe's ``Model``: load once, then per
batch preprocess, predict, postprocess. The artifact is a directory holding
``model.py`` (and whatever the model reads), or the ``.py`` file itself; the
class is ``contract.handler`` (default ``Model``)::

    class Model:
        def __init__(self, model_dir: pathlib.Path) -> None: ...   # load weights once
        def preprocess(self, inputs: dict[str, np.ndarray]) -> Any: ...  # optional
        def predict(self, x: Any) -> Any: ...                      # required
        def postprocess(self, y: Any) -> dict[str, np.ndarray]: ...  # optional

Every tensor is batch first. Without ``preprocess`` ``predict`` gets the inputs
by name; without ``postprocess`` its result is the outputs: a dict by name, or
one array when the contract declares one output. The file is loaded under a
module name of its own, so two models' ``model.py`` never collide.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bouncer.contract import ModelContract
from bouncer.runtimes import ModelLoadError, name_outputs

_loaded = itertools.count()


def _handler_file(contract: ModelContract) -> Path:
    path = Path(contract.artifact).expanduser()
    if not path.exists():
        raise ModelLoadError(
            contract.name,
            f"{path} does not exist",
            "set artifact to the handler's directory (holding model.py) or its .py file",
        )
    file = path / "model.py" if path.is_dir() else path
    if not file.is_file() or file.suffix != ".py":
        raise ModelLoadError(
            contract.name,
            f"{file} is not a Python file",
            "put the handler class in model.py in the artifact directory, or name its .py file",
        )
    return file


def _handler_class(contract: ModelContract, file: Path) -> type[Any]:
    safe = re.sub(r"\W", "_", contract.name)
    module_name = f"_mark_model_{safe}_{next(_loaded)}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ModelLoadError(contract.name, f"cannot load {file}", "name a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickle find a class's module here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a user's file can fail in any way; say which and how
        del sys.modules[module_name]
        raise ModelLoadError(
            contract.name,
            f"{file} failed to import: {type(exc).__name__}: {exc}",
            "fix the file (run it with python to see the error)",
        ) from None
    name = contract.handler or "Model"
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        classes = [
            k
            for k, v in vars(module).items()
            if isinstance(v, type) and v.__module__ == module_name
        ]
        found = f" (it defines {', '.join(classes)})" if classes else ""
        raise ModelLoadError(
            contract.name,
            f"{file} has no class {name!r}{found}",
            "set handler to the class's name, or define the class in the file",
            field="handler",
        )
    if not callable(getattr(cls, "predict", None)):
        raise ModelLoadError(
            contract.name,
            f"class {name!r} in {file} has no predict method",
            "define predict(self, x) returning the outputs",
            field="handler",
        )
    return cls


def _identity(x: Any) -> Any:
    return x


class PythonRuntime:
    """A handler instance: preprocess, predict, postprocess per batch."""

    def __init__(self, contract: ModelContract, handler: Any) -> None:
        self.contract = contract
        self.handler = handler
        self._pre: Callable[[Any], Any] = getattr(handler, "preprocess", _identity)
        self._post: Callable[[Any], Any] = getattr(handler, "postprocess", _identity)

    def run(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        result = self._post(self.handler.predict(self._pre(dict(inputs))))
        if isinstance(result, Mapping) or len(self.contract.outputs) != 1:
            return name_outputs(self.contract, result, "value")
        return {self.contract.outputs[0].name: result}

    def synchronize(self) -> None:
        """Nothing: a handler returns when its work is done."""


def load_python(contract: ModelContract) -> PythonRuntime:
    """The contract's handler class, instantiated on its model directory."""
    file = _handler_file(contract)
    cls = _handler_class(contract, file)
    try:
        handler = cls(file.parent)
    except Exception as exc:  # the user's loading code
        raise ModelLoadError(
            contract.name,
            f"{cls.__name__}({file.parent}) failed: {type(exc).__name__}: {exc}",
            "make the constructor load the model from the directory it is given",
        ) from None
    return PythonRuntime(contract, handler)
