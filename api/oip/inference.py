"""One OIP inference: the request checked against the signature, TF Serving's Predict, the answer.

    result = await Inference(catalog, shedding=True).infer(request, ctx.deadline)

REST (`api.oip.rest`) and gRPC (`api.oip.grpc_service`) both call `infer`, so the two fronts
check, call and answer alike. The request's model and version are resolved to a version
number (`api.oip.catalog`), its inputs checked against that version's SignatureDef (every
input present, none extra, each of the signature's datatype and rank, its fixed dimensions
equal) and sent to serving as one Predict through the worker's serving client, which gives
it the same deadline, coalescing, replicas, retries and discovery as the model routes. With
`shedding` a request whose remaining budget is below the model's median latency is refused
without calling serving, as the model routes' (`api.request.admission.shedding`).

The answer has the outputs asked for, in the order asked, else every output of the
signature sorted by name; each output's datatype is the one serving answered with (gRPC) or
the signature's (TF Serving's REST answer carries JSON numbers only).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from api.oip.catalog import Catalog, Resolved
from api.oip.datatypes import Datatype, datatype_of
from api.oip.types import SIGNATURE_PARAMETER, InferInput, InferOutput, InferRequest, InferResult, OipError, invalid
from api.request.admission.shedding import LatencyEstimate
from api.request.context import current_context
from api.serving_client import (
    Code,
    Deadline,
    DeadlineExceeded,
    ModelSpec,
    PredictRequest,
    PredictResponse,
    ServingError,
    ServingNotFound,
    ServingTimeout,
    SignatureInfo,
    Tensor,
    TensorInfo,
)


class Inference:
    """The OIP front's inferences in one worker.

    Args:
        catalog: the exposed models, resolved against serving.
        shedding: refuse a request whose budget left is below the model's median latency.
        max_models: models whose latency is tracked for shedding at most (LRU).
    """

    def __init__(self, catalog: Catalog, *, shedding: bool = False, max_models: int = 256) -> None:
        self.catalog = catalog
        self.shedding = shedding
        self._max_models = max_models
        self._latency: OrderedDict[str, LatencyEstimate] = OrderedDict()

    def _estimate(self, model_name: str) -> LatencyEstimate:
        estimate = self._latency.get(model_name)
        if estimate is None:
            estimate = self._latency[model_name] = LatencyEstimate()
            while len(self._latency) > self._max_models:
                self._latency.popitem(last=False)
        self._latency.move_to_end(model_name)
        return estimate

    async def infer(self, request: InferRequest, deadline: Deadline) -> InferResult:
        """Run `request` on serving (see module doc).

        Raises:
            OipError: INVALID_ARGUMENT (400) for inputs or outputs that do not fit the
                signature; NOT_FOUND (404) for an unknown model or version; a serving
                failure or the deadline (`OipError.from_serving`), DEADLINE_EXCEEDED when
                shed.
        """
        given = request.parameters.get(SIGNATURE_PARAMETER)
        if given is not None and not isinstance(given, str):
            raise invalid(f"the {SIGNATURE_PARAMETER} parameter must be a string")
        resolved = await self.catalog.resolve(request.model_name, request.model_version, deadline)
        signature = resolved.signature(request.signature_name)
        inputs = check_inputs(request.inputs, signature, resolved)
        names = output_names(request, signature, resolved)
        estimate = self._estimate(resolved.name)
        if self.shedding:
            typical = estimate.median()
            left = deadline.remaining()
            if typical is not None and left < typical:
                raise OipError(
                    Code.DEADLINE_EXCEEDED,
                    f"{max(left, 0.0) * 1000:.0f} ms of the request's budget left, less than the "
                    f"{typical * 1000:.0f} ms model '{resolved.name}' takes now: refused without calling serving",
                )
        started = time.monotonic()
        for attempt in (1, 2):
            spec = ModelSpec(resolved.name, request.signature_name, resolved.version)
            output_filter = tuple(names) if request.outputs else ()
            try:
                response = await self.catalog.client.predict(PredictRequest(spec, inputs, output_filter), deadline)
            except ServingNotFound as exc:
                # The version we pinned went away (a newer one replaced it): read it again once.
                self.catalog.forget(resolved.name)
                if resolved.pinned or attempt == 2:
                    raise OipError.from_serving(exc) from exc
                resolved = await self.catalog.resolve(request.model_name, request.model_version, deadline)
                continue
            except ServingTimeout as exc:
                estimate.record(time.monotonic() - started)
                raise OipError.from_serving(exc) from exc
            except (ServingError, DeadlineExceeded) as exc:
                raise OipError.from_serving(exc) from exc
            estimate.record(time.monotonic() - started)
            current_context().set_model(resolved.name, resolved.version)
            outputs = answer_outputs(response, names, signature, resolved)
            return InferResult(resolved.name, str(resolved.version), outputs, request.id)
        raise AssertionError("unreachable")


def _where(resolved: Resolved) -> str:
    return f"model '{resolved.name}' version {resolved.version}"


def check_inputs(inputs: Sequence[InferInput], signature: SignatureInfo, resolved: Resolved) -> dict[str, Tensor]:
    """The request's inputs as the serving client's tensors, checked against the signature.

    Raises:
        OipError: INVALID_ARGUMENT naming the input: not in the signature, given twice,
            missing, of another datatype, of another rank or fixed dimension, with a dimension
            of 0 (no elements: an empty batch is not sent to serving), or with a value count
            that does not fit its shape.
    """
    tensors: dict[str, Tensor] = {}
    for given in inputs:
        info = signature.inputs.get(given.name)
        if info is None:
            known = ", ".join(sorted(signature.inputs)) or "none"
            raise invalid(f"{_where(resolved)} has no input '{given.name}' (its inputs: {known})")
        if given.name in tensors:
            raise invalid(f"input '{given.name}' is given twice")
        expected = _datatype(info, given.name, "input")
        if given.datatype is not expected:
            raise invalid(
                f"input '{given.name}' of {_where(resolved)} is {expected.name}, "
                f"the request sends {given.datatype.name}"
            )
        if 0 in given.shape:
            # An empty batch is refused here, not sent: TF Serving answers one with the
            # graph's own failure (a kernel's shape check), naming graph nodes, or with an
            # empty answer, model by model; the protocol says nothing of either.
            raise invalid(
                f"input '{given.name}' has shape {list(given.shape)}, which holds no elements: every "
                "dimension, the batch dimension included, must be at least 1"
            )
        if info.shape is not None and not _fits(given.shape, info.shape):
            raise invalid(
                f"input '{given.name}' of {_where(resolved)} has shape {list(info.shape)} (-1: any size), "
                f"the request sends {list(given.shape)}"
            )
        try:
            tensors[given.name] = Tensor(given.shape, given.values, expected.dtype)
        except ValueError as exc:
            raise invalid(f"input '{given.name}': {exc}") from None
    missing = sorted(signature.inputs.keys() - tensors.keys())
    if missing:
        raise invalid(f"{_where(resolved)} needs input(s) {', '.join(missing)}, which the request does not send")
    return tensors


def _datatype(info: TensorInfo, name: str, kind: str) -> Datatype:
    datatype = datatype_of(info.dtype)
    if datatype is None:
        raise invalid(f"{kind} '{name}' has a dtype the Open Inference Protocol cannot carry")
    return datatype


def _fits(given: Sequence[int], declared: Sequence[int]) -> bool:
    return len(given) == len(declared) and all(d in (-1, g) for g, d in zip(given, declared, strict=True))


def output_names(request: InferRequest, signature: SignatureInfo, resolved: Resolved) -> list[str]:
    """The outputs to answer, in order: those asked for, else the signature's, sorted.

    Raises:
        OipError: INVALID_ARGUMENT for an output not in the signature, or asked for twice.
    """
    if not request.outputs:
        return sorted(signature.outputs)
    names: list[str] = []
    for output in request.outputs:
        if output.name not in signature.outputs:
            known = ", ".join(sorted(signature.outputs)) or "none"
            raise invalid(f"{_where(resolved)} has no output '{output.name}' (its outputs: {known})")
        if output.name in names:
            raise invalid(f"output '{output.name}' is asked for twice")
        names.append(output.name)
    return names


def answer_outputs(
    response: PredictResponse, names: Sequence[str], signature: SignatureInfo, resolved: Resolved
) -> list[InferOutput]:
    """Serving's answer as the OIP outputs `names`, in that order.

    Raises:
        OipError: INTERNAL (502) when serving left out an output or answered one whose shape
            and values disagree.
    """
    answered: Mapping[str, Tensor] = response.outputs
    if set(answered) == {""} and len(signature.outputs) == 1:  # REST's one unnamed output
        answered = {next(iter(signature.outputs)): answered[""]}
    outputs = []
    for name in names:
        tensor = answered.get(name)
        if tensor is None:
            raise OipError(Code.INTERNAL, f"serving tier: {_where(resolved)} answered without output '{name}'")
        datatype = datatype_of(tensor.dtype) if tensor.dtype is not None else None
        if datatype is None:
            datatype = _datatype(signature.outputs[name], name, "output")
        if len(tensor.values) != math.prod(tensor.shape):
            raise OipError(Code.INTERNAL, f"serving tier: output '{name}' has values that do not fit its shape")
        outputs.append(InferOutput(name, datatype, tuple(tensor.shape), tensor.values))
    return outputs
