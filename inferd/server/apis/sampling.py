"""Request fields -> SamplingParams, the same way for every API (an API's renderer names its own fields)."""

from __future__ import annotations

from inferd.engine.types import SamplingParams
from inferd.model.sampling_defaults import SamplingDefaults
from inferd.server.protocol import ProtocolError


def sampling_params(
    defaults: SamplingDefaults,
    *,
    choice: int = 0,
    logprobs: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logit_bias: dict[int, float] | None = None,
    seed: int | None = None,
) -> SamplingParams:
    """None: the server's default (`defaults`: the model's, else llama.cpp's). `choice` is the choice's index
    among its prompt's: n choices of one seed must differ."""
    greedy = top_p == 0.0  # OpenAI accepts top_p 0: only the most likely token, i.e. greedy
    params = SamplingParams(
        temperature=0.0 if greedy else defaults.temperature if temperature is None else temperature,
        top_k=defaults.top_k if top_k is None else max(top_k, 0),  # -1 (vLLM's "off") is 0 here
        top_p=1.0 if greedy else defaults.top_p if top_p is None else top_p,
        min_p=defaults.min_p if min_p is None else min_p,
        repetition_penalty=defaults.repetition_penalty if repetition_penalty is None else repetition_penalty,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        logit_bias=logit_bias,
        seed=seed + choice if seed is not None and choice else seed,
        logprobs=logprobs,
    )
    try:
        params.validate()
    except ValueError as e:  # its message starts with the field's name
        raise ProtocolError(str(e), str(e).split(" ", 1)[0]) from None
    return params
