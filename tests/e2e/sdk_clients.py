"""The OpenAI and Anthropic Python SDKs against the gateway, unchanged.

Usage: sdk_clients.py BASE_URL MODEL; prints one JSON object of what each
call returned, for tests/e2e/gateway.rs to check.
"""

import json
import sys

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
out = {}

oa = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0, timeout=30)
listed = oa.models.list()
out["models"] = [{"id": m.id, "parent": getattr(m, "parent", None)} for m in listed.data]
emb = oa.embeddings.create(model=model, input=["a gateway", "of many models"])
out["embeddings"] = {"model": emb.model, "n": len(emb.data), "dims": len(emb.data[0].embedding)}

an = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0, timeout=30)
msg = an.messages.create(
    model=model,
    max_tokens=8,
    system="Answer briefly.",
    messages=[{"role": "user", "content": "Name a prime number."}],
)
out["message"] = {
    "type": msg.type,
    "text": "".join(b.text for b in msg.content if b.type == "text"),
    "stop_reason": msg.stop_reason,
    "input_tokens": msg.usage.input_tokens,
}
events = []
text = []
with an.messages.create(
    model=model,
    max_tokens=8,
    messages=[{"role": "user", "content": "Count to three."}],
    stream=True,
) as stream:
    for ev in stream:
        events.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text.append(ev.delta.text)
out["stream"] = {"events": events, "text": "".join(text)}
print(json.dumps(out))
