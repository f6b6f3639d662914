from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ThreadSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    THREAD_SOURCE_UNSPECIFIED: _ClassVar[ThreadSource]
    THREAD_SOURCE_FLAG: _ClassVar[ThreadSource]
    THREAD_SOURCE_MEASURED: _ClassVar[ThreadSource]
    THREAD_SOURCE_ONE_CPU: _ClassVar[ThreadSource]
    THREAD_SOURCE_TENSOR_PARALLEL: _ClassVar[ThreadSource]
THREAD_SOURCE_UNSPECIFIED: ThreadSource
THREAD_SOURCE_FLAG: ThreadSource
THREAD_SOURCE_MEASURED: ThreadSource
THREAD_SOURCE_ONE_CPU: ThreadSource
THREAD_SOURCE_TENSOR_PARALLEL: ThreadSource

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("version", "parallelism", "model", "max_model_len", "kv_block_size", "num_kv_blocks", "kv_capacity_tokens", "prefix_caching", "prefix_cache_root_hash", "tokenizer_fingerprint")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHING_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    version: str
    parallelism: Parallelism
    model: str
    max_model_len: int
    kv_block_size: int
    num_kv_blocks: int
    kv_capacity_tokens: int
    prefix_caching: bool
    prefix_cache_root_hash: int
    tokenizer_fingerprint: str
    def __init__(self, version: _Optional[str] = ..., parallelism: _Optional[_Union[Parallelism, _Mapping]] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., kv_block_size: _Optional[int] = ..., num_kv_blocks: _Optional[int] = ..., kv_capacity_tokens: _Optional[int] = ..., prefix_caching: _Optional[bool] = ..., prefix_cache_root_hash: _Optional[int] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class Parallelism(_message.Message):
    __slots__ = ("data_parallel_rank", "data_parallel_size", "tensor_parallel_size", "decode_context_parallel_size", "dcp_kv_interleave")
    DATA_PARALLEL_RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DECODE_CONTEXT_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DCP_KV_INTERLEAVE_FIELD_NUMBER: _ClassVar[int]
    data_parallel_rank: int
    data_parallel_size: int
    tensor_parallel_size: int
    decode_context_parallel_size: int
    dcp_kv_interleave: int
    def __init__(self, data_parallel_rank: _Optional[int] = ..., data_parallel_size: _Optional[int] = ..., tensor_parallel_size: _Optional[int] = ..., decode_context_parallel_size: _Optional[int] = ..., dcp_kv_interleave: _Optional[int] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model", "architecture", "vocab_size", "max_model_len", "eos_token_ids", "bos_token_id", "dtype", "quantization", "kernels", "batch_invariant", "cpu", "num_threads", "thread_source", "usable_cpus", "omp_wait_policy", "thread_trials")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    BATCH_INVARIANT_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    NUM_THREADS_FIELD_NUMBER: _ClassVar[int]
    THREAD_SOURCE_FIELD_NUMBER: _ClassVar[int]
    USABLE_CPUS_FIELD_NUMBER: _ClassVar[int]
    OMP_WAIT_POLICY_FIELD_NUMBER: _ClassVar[int]
    THREAD_TRIALS_FIELD_NUMBER: _ClassVar[int]
    model: str
    architecture: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token_id: int
    dtype: str
    quantization: str
    kernels: str
    batch_invariant: bool
    cpu: str
    num_threads: int
    thread_source: ThreadSource
    usable_cpus: int
    omp_wait_policy: str
    thread_trials: _containers.RepeatedCompositeFieldContainer[ThreadTrial]
    def __init__(self, model: _Optional[str] = ..., architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token_id: _Optional[int] = ..., dtype: _Optional[str] = ..., quantization: _Optional[str] = ..., kernels: _Optional[str] = ..., batch_invariant: _Optional[bool] = ..., cpu: _Optional[str] = ..., num_threads: _Optional[int] = ..., thread_source: _Optional[_Union[ThreadSource, str]] = ..., usable_cpus: _Optional[int] = ..., omp_wait_policy: _Optional[str] = ..., thread_trials: _Optional[_Iterable[_Union[ThreadTrial, _Mapping]]] = ...) -> None: ...

class ThreadTrial(_message.Message):
    __slots__ = ("num_threads", "one_row_step_ms", "batch_step_ms", "batch_rows")
    NUM_THREADS_FIELD_NUMBER: _ClassVar[int]
    ONE_ROW_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    num_threads: int
    one_row_step_ms: float
    batch_step_ms: float
    batch_rows: int
    def __init__(self, num_threads: _Optional[int] = ..., one_row_step_ms: _Optional[float] = ..., batch_step_ms: _Optional[float] = ..., batch_rows: _Optional[int] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("num_running", "num_waiting", "kv_usage", "num_used_blocks", "num_cached_free_blocks", "num_free_blocks", "num_cached_blocks", "prefix_cache_query_tokens", "prefix_cache_hit_tokens")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    kv_usage: float
    num_used_blocks: int
    num_cached_free_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    prefix_cache_query_tokens: int
    prefix_cache_hit_tokens: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., num_used_blocks: _Optional[int] = ..., num_cached_free_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_cached_blocks: _Optional[int] = ..., prefix_cache_query_tokens: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("aborted_request_ids",)
    ABORTED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    aborted_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, aborted_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ResetPrefixCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetPrefixCacheResponse(_message.Message):
    __slots__ = ("num_cleared_blocks",)
    NUM_CLEARED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_cleared_blocks: int
    def __init__(self, num_cleared_blocks: _Optional[int] = ...) -> None: ...

class WatchKvEventsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvBlock(_message.Message):
    __slots__ = ("block_hash", "parent_hash", "num_tokens")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    parent_hash: int
    num_tokens: int
    def __init__(self, block_hash: _Optional[int] = ..., parent_hash: _Optional[int] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class KvSnapshot(_message.Message):
    __slots__ = ("blocks", "pending")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[KvBlock]
    pending: _containers.RepeatedCompositeFieldContainer[PendingPrefix]
    def __init__(self, blocks: _Optional[_Iterable[_Union[KvBlock, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[PendingPrefix, _Mapping]]] = ...) -> None: ...

class PendingPrefix(_message.Message):
    __slots__ = ("key", "block_hashes")
    KEY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    key: int
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, key: _Optional[int] = ..., block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: KvBlock
    def __init__(self, block: _Optional[_Union[KvBlock, _Mapping]] = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("block_hash",)
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    def __init__(self, block_hash: _Optional[int] = ...) -> None: ...

class AllBlocksCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PrefixAnnounced(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: PendingPrefix
    def __init__(self, prefix: _Optional[_Union[PendingPrefix, _Mapping]] = ...) -> None: ...

class PrefixSettled(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: int
    def __init__(self, key: _Optional[int] = ...) -> None: ...

class WatchKvEventsResponse(_message.Message):
    __slots__ = ("incarnation_id", "sequence_number", "snapshot", "stored", "removed", "cleared", "announced", "settled", "sent_unix_nanos")
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    ANNOUNCED_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    incarnation_id: str
    sequence_number: int
    snapshot: KvSnapshot
    stored: BlockStored
    removed: BlockRemoved
    cleared: AllBlocksCleared
    announced: PrefixAnnounced
    settled: PrefixSettled
    sent_unix_nanos: int
    def __init__(self, incarnation_id: _Optional[str] = ..., sequence_number: _Optional[int] = ..., snapshot: _Optional[_Union[KvSnapshot, _Mapping]] = ..., stored: _Optional[_Union[BlockStored, _Mapping]] = ..., removed: _Optional[_Union[BlockRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllBlocksCleared, _Mapping]] = ..., announced: _Optional[_Union[PrefixAnnounced, _Mapping]] = ..., settled: _Optional[_Union[PrefixSettled, _Mapping]] = ..., sent_unix_nanos: _Optional[int] = ...) -> None: ...

class GetTokenizerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTokenizerResponse(_message.Message):
    __slots__ = ("tokenizer_json", "chat_template", "fingerprint", "chat_special_tokens", "reasoning_start", "reasoning_end", "tool_call_start", "tool_call_end")
    class ChatSpecialTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CHAT_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_START_FIELD_NUMBER: _ClassVar[int]
    REASONING_END_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_START_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_END_FIELD_NUMBER: _ClassVar[int]
    tokenizer_json: bytes
    chat_template: str
    fingerprint: str
    chat_special_tokens: _containers.ScalarMap[str, str]
    reasoning_start: str
    reasoning_end: str
    tool_call_start: str
    tool_call_end: str
    def __init__(self, tokenizer_json: _Optional[bytes] = ..., chat_template: _Optional[str] = ..., fingerprint: _Optional[str] = ..., chat_special_tokens: _Optional[_Mapping[str, str]] = ..., reasoning_start: _Optional[str] = ..., reasoning_end: _Optional[str] = ..., tool_call_start: _Optional[str] = ..., tool_call_end: _Optional[str] = ...) -> None: ...
