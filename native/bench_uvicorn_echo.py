"""A trivial ASGI app answering the same echo JSON as native/echo_front.py's /echo
(comparison baseline): python native/bench_uvicorn_echo.py PORT"""
import json
import sys

import uvicorn


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    out = json.dumps({
        "method": scope["method"], "path": scope["path"],
        "query": scope["query_string"].decode("latin-1"), "body": body.decode("latin-1"),
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
    }).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http="httptools", loop="asyncio",
                log_level="warning", access_log=False, backlog=1024)
