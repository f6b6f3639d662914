"""dpgate's Python client library: blocking and asyncio clients of the dpgate.v1 schema.

`from dpgate.client import DpgateClient, GenerationOptions`; the clients are in clients.py, their
options, results, streams and chat types beside it (docs/client.md).
"""

from dpgate.client.clients import (
    RANK_METADATA_KEY as RANK_METADATA_KEY,
)
from dpgate.client.clients import (
    AsyncChatStream as AsyncChatStream,
)
from dpgate.client.clients import (
    AsyncDpgateClient as AsyncDpgateClient,
)
from dpgate.client.clients import (
    AsyncTokenStream as AsyncTokenStream,
)
from dpgate.client.clients import (
    ChatCompletion as ChatCompletion,
)
from dpgate.client.clients import (
    ChatItem as ChatItem,
)
from dpgate.client.clients import (
    ChatMessage as ChatMessage,
)
from dpgate.client.clients import (
    ChatStream as ChatStream,
)
from dpgate.client.clients import (
    ChatTool as ChatTool,
)
from dpgate.client.clients import (
    Completion as Completion,
)
from dpgate.client.clients import (
    ContentDelta as ContentDelta,
)
from dpgate.client.clients import (
    DpgateClient as DpgateClient,
)
from dpgate.client.clients import (
    DpgateError as DpgateError,
)
from dpgate.client.clients import (
    Finish as Finish,
)
from dpgate.client.clients import (
    FinishReason as FinishReason,
)
from dpgate.client.clients import (
    GenerationOptions as GenerationOptions,
)
from dpgate.client.clients import (
    ReasoningDelta as ReasoningDelta,
)
from dpgate.client.clients import (
    TextDelta as TextDelta,
)
from dpgate.client.clients import (
    TlsOptions as TlsOptions,
)
from dpgate.client.clients import (
    TokenStream as TokenStream,
)
from dpgate.client.clients import (
    ToolCall as ToolCall,
)
from dpgate.client.clients import (
    ToolCallItem as ToolCallItem,
)
from dpgate.client.clients import (
    Usage as Usage,
)
