"""POST /v1/cache/warm: prefill a draft into the prefix cache while the user types."""

import json
import urllib.error
import urllib.request

SYSTEM = ("You are the support assistant of a bicycle shop. Answer briefly and politely; mention opening "
          "hours (9 to 18, Monday to Saturday) when relevant, and never promise repairs on the same day. ") * 3


def post(srv, path, body):
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def messages(draft):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": draft}]


def test_warm_while_typing_then_the_chat_request_is_cached(make_server):
    srv = make_server()
    draft1 = "Hello, my bike has a flat tyre and the chain keeps slipping when I ride uphill. Could"
    status, w1 = post(srv, "/v1/cache/warm", {"messages": messages(draft1)})
    assert status == 200
    assert w1["cached_tokens"] == w1["prompt_tokens"] >= 128      # every token, to the last (hits within a block)
    assert w1["computed_tokens"] == w1["cached_tokens"]          # nothing was cached before

    # the same draft again computes nothing
    status, again = post(srv, "/v1/cache/warm", {"messages": messages(draft1)})
    assert (again["cached_tokens"], again["computed_tokens"]) == (w1["cached_tokens"], 0)

    # the user typed on: only the new text is computed
    draft2 = draft1 + (" you tell me whether you can fix both this week, and what it would cost roughly? I also "
                       "wonder whether the brakes should be checked, because they squeak in the rain and the "
                       "rear one feels soft. I can bring the bike on Thursday or Friday morning. Thanks")
    status, w2 = post(srv, "/v1/cache/warm", {"messages": messages(draft2)})
    assert w2["prompt_tokens"] // 64 > w1["prompt_tokens"] // 64   # the draft crossed a block boundary
    assert w2["cached_tokens"] == w2["prompt_tokens"]
    assert w2["computed_tokens"] == w2["cached_tokens"] - w1["cached_tokens"]

    # the real request, with the finished message, starts from the warmed blocks
    final = draft2 + " a lot!"
    status, r = post(srv, "/v1/chat/completions", {"messages": messages(final), "max_tokens": 4})
    assert status == 200
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == w2["cached_tokens"]
    srv.wait_idle()


def test_last_token_held_back_unless_the_text_ends_in_punctuation(make_server):
    srv = make_server()
    tok = srv.state.tokenizer
    for text, held_back in (("The quick brown fox", 1), ("The quick brown fox ", 1), ("The quick brown fox.", 0),
                            ("Well,", 0)):
        status, w = post(srv, "/v1/cache/warm", {"prompt": text})
        assert status == 200
        assert w["prompt_tokens"] == len(tok.encode(text)) - held_back, text
        assert w["cached_tokens"] == w["prompt_tokens"]   # shorter than a block of 64, cached all the same


def test_warmed_prompt_is_cached_for_completions(make_server):
    srv = make_server()
    text = "Chapter one. " + "It was a bright cold day in April, and the clocks were striking thirteen. " * 6
    status, w = post(srv, "/v1/cache/warm", {"prompt": text})
    assert w["cached_tokens"] == w["prompt_tokens"] >= 64
    status, r = post(srv, "/v1/completions", {"prompt": text + "Winston", "max_tokens": 2})
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == w["cached_tokens"]


def test_warm_request_errors(server):
    status, r = post(server, "/v1/cache/warm", {"prompt": "a", "messages": messages("b")})
    assert status == 400 and r["error"]["message"] == "send exactly one of prompt or messages"
    status, r = post(server, "/v1/cache/warm", {})
    assert status == 400 and r["error"]["param"] == "prompt"
    status, r = post(server, "/v1/cache/warm", {"model": "nope", "prompt": "a"})
    assert status == 404 and r["error"]["param"] == "model"
    status, r = post(server, "/v1/cache/warm", {"messages": [{"role": "robot", "content": "x"}]})
    assert status == 400 and r["error"]["param"] == "messages[0].role"
