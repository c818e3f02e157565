"""One assistant turn through the openai SDK, streamed or not, as a plain message dict."""


def ask(client, model, messages, tools, stream):
    """Returns the assistant message as the client would append it to its history."""
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
        return reply.choices[0].message.model_dump(exclude_none=True)
    content, calls = None, {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            slot = calls.setdefault(call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            if call.id:
                slot["id"] = call.id
            if call.function and call.function.name:
                slot["function"]["name"] += call.function.name
            if call.function and call.function.arguments:
                slot["function"]["arguments"] += call.function.arguments
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
