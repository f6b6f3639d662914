"""`gateway.client`, where the client library lived before it left the server's package: kept as a
re-export of `dpgate.client` because code written against the README imports it from here."""

from dpgate.client import (
    RANK_METADATA_KEY as RANK_METADATA_KEY,
)
from dpgate.client import (
    AsyncChatStream as AsyncChatStream,
)
from dpgate.client import (
    AsyncDpgateClient as AsyncDpgateClient,
)
from dpgate.client import (
    AsyncTokenStream as AsyncTokenStream,
)
from dpgate.client import (
    ChatCompletion as ChatCompletion,
)
from dpgate.client import (
    ChatItem as ChatItem,
)
from dpgate.client import (
    ChatMessage as ChatMessage,
)
from dpgate.client import (
    ChatStream as ChatStream,
)
from dpgate.client import (
    ChatTool as ChatTool,
)
from dpgate.client import (
    Completion as Completion,
)
from dpgate.client import (
    ContentDelta as ContentDelta,
)
from dpgate.client import (
    DpgateClient as DpgateClient,
)
from dpgate.client import (
    DpgateError as DpgateError,
)
from dpgate.client import (
    Finish as Finish,
)
from dpgate.client import (
    FinishReason as FinishReason,
)
from dpgate.client import (
    GenerationOptions as GenerationOptions,
)
from dpgate.client import (
    ReasoningDelta as ReasoningDelta,
)
from dpgate.client import (
    TextDelta as TextDelta,
)
from dpgate.client import (
    TlsOptions as TlsOptions,
)
from dpgate.client import (
    TokenStream as TokenStream,
)
from dpgate.client import (
    ToolCall as ToolCall,
)
from dpgate.client import (
    ToolCallItem as ToolCallItem,
)
from dpgate.client import (
    Usage as Usage,
)
