# SPDX-License-Identifier: Apache-2.0
"""Drives `ingero mcp` with the official MCP Python SDK (PyPI `mcp`).

usage: mcp_client.py stdio CALLS_JSON INGERO_BIN ARG...
       mcp_client.py http  CALLS_JSON URL TOKEN|- CA_PEM|- [CLIENT_CERT CLIENT_KEY]

CALLS_JSON is a list of [tool, arguments]. Prints one JSON object: the tools
listed and, per call, whether it was a tool error, its structured content and
its text; over HTTP also the status a bare request got and, when no session
could be opened, why. Assertions are the Rust test's (cli/tests/it/mcp.rs).
"""

import asyncio
import json
import ssl
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def drive(client, calls):
    listed = await client.list_tools()
    out = {
        "server": client.server_info.name if client.server_info else None,
        "instructions": client.instructions,
        "tools": [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in listed.tools
        ],
        "calls": [],
    }
    for name, args in calls:
        try:
            r = await client.call_tool(name, args)
            text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
            out["calls"].append(
                {"tool": name, "is_error": bool(r.is_error), "structured": r.structured_content, "text": text}
            )
        except Exception as e:  # a protocol error: the test says which call
            out["calls"].append({"tool": name, "protocol_error": f"{type(e).__name__}: {e}"})
    return out


async def main():
    mode, calls = sys.argv[1], json.loads(sys.argv[2])
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:])
        async with Client(params) as client:
            result = await drive(client, calls)
    else:
        url, token, ca = sys.argv[3], sys.argv[4], sys.argv[5]
        headers = {} if token == "-" else {"Authorization": f"Bearer {token}"}
        verify = ssl.create_default_context(cafile=ca) if ca != "-" else True
        if len(sys.argv) > 7:
            verify.load_cert_chain(sys.argv[6], sys.argv[7])
        async with httpx2.AsyncClient(headers=headers, verify=verify, timeout=120) as http:
            # The status a plain request gets (the SDK does not surface a 401).
            try:
                probe = (await http.post(
                    url,
                    json={"jsonrpc": "2.0", "id": 0, "method": "ping"},
                    headers={"Accept": "application/json, text/event-stream"},
                )).status_code
            except Exception as e:  # refused in the TLS handshake
                print(json.dumps({"connect_error": repr(e)}))
                return
            try:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    result = await drive(client, calls)
            except Exception as e:
                result = {"session_error": repr(e)}
            result["http_status"] = probe
    print(json.dumps(result))


asyncio.run(main())
