"""The README example's MCP server (stdio): `python examples/pydantic_ai/backoffice.py`."""

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("backoffice")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"{order_id} shipped yesterday"


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def tag_ticket(ticket_id: str, tag: str) -> str:
    """Tag a ticket (tagging it twice changes nothing)."""
    return f"{ticket_id} tagged {tag}"


if __name__ == "__main__":
    server.run(transport="stdio")
