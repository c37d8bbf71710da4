"""A handler that calls its provider through the real openai SDK, as docs/admission.md's does.

The payload: ``base`` (the provider's server; the route's provider is the path under it),
``prompt``, and optionally ``max_retries`` (absent: the SDK's own default, which retries a
429 itself). The route the admission chose picks the model, the provider and the key.
"""
from __future__ import annotations

import openai  # imported here so that the zygote has it loaded before it forks workers

import fleet

_NOT_GIVEN = object()


def chat(unit):
    p = unit.payload
    model, provider, key = unit.route
    retries = p.get("max_retries", _NOT_GIVEN)
    client = openai.OpenAI(base_url=f"{p['base']}/{provider}/v1", api_key=key or "no-key",
                           **({} if retries is _NOT_GIVEN else {"max_retries": retries}))
    try:
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": p["prompt"]}])
    except Exception as exc:  # a refusal goes to the admission; anything else stays what it is
        raise fleet.Refused.from_exception(exc) or exc
    finally:
        client.close()
    return reply.choices[0].message.content
