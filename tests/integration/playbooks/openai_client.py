# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Talk to the deployed endpoint as a user's program does, after sourcing the deploy's client file.

Argument: the client file (export lines for OPENAI_BASE_URL, OPENAI_API_KEY and GPULAB_MODEL, as the deploy writes
it). The official openai client then takes the endpoint and the key from the environment, as the snippet the deploy
prints does. Prints one JSON object: the base URL, a completion, a chat answer, a streamed chat answer (and its chunk
count), and what a wrong key got. Exits 1 with the error when any of them fails; the key itself is never printed.
"""

import json
import os
import shlex
import sys

import openai


def source(path: str) -> None:
    """What `. FILE` does for a file of `export NAME=VALUE` lines."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            words = shlex.split(line, comments=True)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                name, value = words[1].split("=", 1)
                os.environ[name] = value


def main(client_file: str) -> int:
    source(client_file)
    base_url, model = os.environ["OPENAI_BASE_URL"], os.environ["GPULAB_MODEL"]
    client = openai.OpenAI(max_retries=0, timeout=60)
    # Random weights may end a turn at once; min_tokens (vLLM's own parameter) keeps the answers non-empty.
    extra = {"min_tokens": 4}
    found = {"base_url": str(client.base_url).rstrip("/")}
    try:
        completion = client.completions.create(model=model, prompt="Hello, my name is", max_tokens=8,
                                               extra_body=extra)
        found["completion"] = completion.choices[0].text
        chat = client.chat.completions.create(model=model, max_tokens=8, extra_body=extra,
                                              messages=[{"role": "user", "content": "Say hello."}])
        found["chat"] = chat.choices[0].message.content
        chunks = 0
        streamed = []
        for chunk in client.chat.completions.create(model=model, max_tokens=8, extra_body=extra, stream=True,
                                                    messages=[{"role": "user", "content": "Count to three."}]):
            chunks += 1
            if chunk.choices and chunk.choices[0].delta.content:
                streamed.append(chunk.choices[0].delta.content)
        found["streamed_chat"] = "".join(streamed)
        found["stream_chunks"] = chunks
    except openai.OpenAIError as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(found))
        return 1
    wrong = openai.OpenAI(base_url=base_url, api_key="not-the-key", max_retries=0, timeout=60)
    try:
        wrong.completions.create(model=model, prompt="Hello", max_tokens=4)
        found["wrong_key"] = "answered"
    except openai.AuthenticationError as exc:
        found["wrong_key"] = f"refused ({exc.status_code})"
    except openai.OpenAIError as exc:
        found["wrong_key"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
