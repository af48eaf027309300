"""A seeded sampling request returns the same text alone and beside 8 other requests."""

import asyncio

import openai
import pytest


@pytest.fixture
def aclient(server):
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def test_seeded_request_same_text_alone_or_beside_8_others(aclient, model_name, server):
    seeded = dict(model=model_name, prompt="Once upon a time, in a small village,", max_tokens=40,
                  temperature=0.9, top_p=0.95, seed=1234, extra_body={"ignore_eos": True})
    alone = (await aclient.completions.create(**seeded)).choices[0].text
    others = [dict(model=model_name, prompt=f"Item {i}: a list of {i} fruits:", max_tokens=10 + 7 * i,
                   temperature=1.0, seed=i) for i in range(8)]
    results = await asyncio.gather(aclient.completions.create(**seeded),
                                   *(aclient.completions.create(**o) for o in others))
    assert results[0].choices[0].text == alone
    assert len(alone) > 20
    # and the seed matters: another seed gives another text
    other_seed = (await aclient.completions.create(**{**seeded, "seed": 4321})).choices[0].text
    assert other_seed != alone
    server.wait_idle()
