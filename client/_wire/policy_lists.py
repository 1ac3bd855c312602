"""The reviewed lists of the default callable policy: what a peer may make a worker run.

This is the one file to review when the policy changes. The default policy allows a callable
only when it is the program's own code, matches a user ``callable_allow`` pattern, or is named
in ``ALLOWED`` below (or is a safe builtin, or a member of one). Everything else is refused, so a
new NumPy or gradwire release cannot widen what a peer may run: ``tests/wire/test_policy_lists.py``
fails when a public NumPy or gradwire callable is in neither ``ALLOWED`` nor ``REFUSED``, and says
which names to review.

Format: each line is a prefix (``"numpy:"`` for module-level names, ``"numpy:ndarray."`` for
members of a class) followed by names; an indented line continues the previous prefix. In
``REFUSED`` a ``*`` refuses everything under its prefix. ``#`` starts a comment.

What is allowed: pure array computations (NumPy's ufuncs, array functions and methods, linear
algebra, FFT, random draws), gradwire's public tensor, autograd, nn and optim API, the public
RPC helpers that only read state. What is refused, with its reason: anything that reads or
writes files, starts processes or threads, opens sockets or contacts other workers, builds a
view over raw memory, reveals memory addresses, installs a hook or callback that runs later,
or changes process-wide settings.
"""

from __future__ import annotations

__all__ = [
    "ALLOWED",
    "REFUSED",
    "ENTRY_POINTS",
    "SAFE_BUILTINS",
    "REFUSED_BUILTIN_MEMBERS",
    "NUMPY_NAMESPACES",
    "GRADWIRE_NAMESPACES",
    "REVIEWED_NUMPY",
    "ABSENT",
    "numpy_series",
]


def _names(block: str) -> frozenset[str]:
    """``"prefix name name"`` lines (indented lines continue the last prefix) -> full names."""
    out: set[str] = set()
    prefix = ""
    for raw in block.splitlines():
        line = raw.split("#", 1)[0]
        if not line.strip():
            continue
        words = line.split()
        if not raw[:1].isspace():
            prefix, words = words[0], words[1:]
            if not prefix.endswith((":", ".")):
                raise ValueError(f"policy list line must start with a prefix: {raw!r}")
        out.update(prefix + w for w in words)
    return frozenset(out)


#: The NumPy release series these lists were reviewed against: every series that
#: ``pyproject.toml``'s NumPy range admits (2.2 is the newest on Python 3.10, 2.4 on 3.11 and
#: newer). ``tests/wire/test_policy_lists.py`` checks completeness against the installed NumPy,
#: and CI runs it on each series. A worker on another series says so once, when it starts.
REVIEWED_NUMPY: tuple[str, ...] = ("2.2", "2.3", "2.4")


def numpy_series(version: str) -> str:
    """``"2.4.6"`` -> ``"2.4"``."""
    return ".".join(version.split(".")[:2])


#: Namespaces whose public callables must each be classified (the completeness test).
NUMPY_NAMESPACES: tuple[str, ...] = (
    "numpy",
    "numpy.linalg",
    "numpy.fft",
    "numpy.random",
    "numpy.lib",
    "numpy.lib.stride_tricks",
    "numpy.lib.npyio",
    "numpy.lib.format",
    "numpy.lib.scimath",
    "numpy.lib.array_utils",
    "numpy.lib.mixins",
    "numpy.lib.introspect",
    "numpy.lib.recfunctions",
    "numpy.char",
    "numpy.strings",
    "numpy.rec",
    "numpy.ma",
    "numpy.polynomial",
    "numpy.dtypes",
    "numpy.exceptions",
    "numpy.testing",
    "numpy.ctypeslib",
    "numpy.typing",
)
GRADWIRE_NAMESPACES: tuple[str, ...] = (
    "gradwire",
    "gradwire.nn",
    "gradwire.nn.functional",
    "gradwire.nn.init",
    "gradwire.distributions",
    "gradwire.optim",
    "gradwire.optim.lr_scheduler",
    "gradwire.autograd",
    "gradwire.futures",
    "gradwire.errors",
    "gradwire.linalg",
    "gradwire.distributed.rpc",
    "gradwire.distributed.rpc.functions",
    "gradwire.distributed.autograd",
    "gradwire.distributed.optim",
    "gradwire.distributed.nn",
    "gradwire.multiprocessing",
    "gradwire.sparse",
)

_ARRAY_METHODS = """
    all any argmax argmin argsort astype byteswap choose clip compress conj conjugate copy
    cumprod cumsum diagonal fill flatten getfield item max mean min nonzero prod put ravel
    repeat reshape resize round searchsorted setfield sort squeeze std sum swapaxes take
    to_device tobytes tolist trace transpose var view
    tostring
"""

ALLOWED: frozenset[str] = _names(
    """
# -- NumPy: array creation, math (ufuncs included), shape, sorting, statistics ---------------
numpy: abs absolute acos acosh add all allclose amax amin angle any append apply_along_axis
    apply_over_axes arange arccos arccosh arcsin arcsinh arctan arctan2 arctanh argmax argmin
    argpartition argsort argwhere around array array2string array_equal array_equiv array_repr
    array_split array_str asanyarray asarray asarray_chkfinite ascontiguousarray asfortranarray
    asin asinh astype atan atan2 atanh atleast_1d atleast_2d atleast_3d average bartlett
    base_repr binary_repr bincount bitwise_and bitwise_count bitwise_invert bitwise_left_shift
    bitwise_not bitwise_or bitwise_right_shift bitwise_xor blackman block broadcast
    broadcast_arrays broadcast_shapes broadcast_to busday_count busday_offset busdaycalendar
    can_cast cbrt ceil choose clip column_stack common_type compress concat concatenate conj
    conjugate convolve copy copysign copyto corrcoef correlate cos cosh count_nonzero cov cross
    cumprod cumsum cumulative_prod cumulative_sum datetime_as_string datetime_data deg2rad
    degrees delete diag diag_indices diag_indices_from diagflat diagonal diff digitize divide
    divmod dot dsplit dstack dtype ediff1d einsum einsum_path empty empty_like equal exp exp2
    expand_dims expm1 extract eye fabs fill_diagonal finfo fix flatiter flatnonzero flip fliplr
    flipud float_power floor floor_divide fmax fmin fmod format_float_positional
    format_float_scientific frexp frombuffer fromfunction fromiter fromstring full full_like gcd
    geomspace get_printoptions getbufsize geterr gradient greater greater_equal hamming hanning
    heaviside histogram histogram2d histogram_bin_edges histogramdd hsplit hstack hypot i0
    identity iinfo imag in1d indices inner insert interp intersect1d invert is_busday isclose
    iscomplex iscomplexobj isdtype isfinite isfortran isin isinf isnan isnat isneginf isposinf
    isreal isrealobj isscalar issubdtype iterable ix_ kaiser kron lcm ldexp left_shift less
    less_equal lexsort linspace log log10 log1p log2 logaddexp logaddexp2 logical_and
    logical_not logical_or logical_xor logspace mask_indices matmul matrix_transpose matvec max
    maximum may_share_memory mean median meshgrid min min_scalar_type minimum mintypecode mod
    modf moveaxis multiply nan_to_num nanargmax nanargmin nancumprod nancumsum nanmax nanmean
    nanmedian nanmin nanpercentile nanprod nanquantile nanstd nansum nanvar ndarray ndenumerate
    ndim ndindex nditer negative nested_iters nextafter nonzero not_equal ones ones_like outer
    packbits pad partition percentile permute_dims piecewise place poly polyadd polyder polydiv
    polyfit polyint polymul polysub polyval positive pow power prod promote_types ptp put
    put_along_axis putmask quantile rad2deg radians ravel ravel_multi_index real real_if_close
    reciprocal remainder repeat require reshape resize result_type right_shift rint roll
    rollaxis roots rot90 round row_stack searchsorted select setdiff1d setxor1d shape
    shares_memory sign signbit sin sinc sinh size sort sort_complex spacing split sqrt square
    squeeze stack std subtract sum swapaxes take take_along_axis tan tanh tensordot tile trace
    transpose trapezoid trapz tri tril tril_indices tril_indices_from trim_zeros triu triu_indices
    triu_indices_from true_divide trunc typename ufunc union1d unique unique_all unique_counts
    unique_inverse unique_values unpackbits unravel_index unstack unwrap vander var vdot vecdot
    vecmat vsplit vstack where zeros zeros_like
# scalar types and their abstract bases
numpy: bool bool_ byte bytes_ cdouble character clongdouble complex128 complex256 complex64
    complexfloating csingle datetime64 double flexible float128 float16 float32 float64 floating
    generic half inexact int16 int32 int64 int8 int_ intc integer intp long longdouble longlong
    number object_ short signedinteger single str_ timedelta64 ubyte uint uint16 uint32 uint64
    uint8 uintc uintp ulong ulonglong unsignedinteger ushort void
numpy:ndarray. argpartition dot partition """
    + _ARRAY_METHODS
    + """
numpy:generic. """
    + _ARRAY_METHODS
    + """
numpy:ufunc. accumulate at outer reduce reduceat resolve_dtypes
numpy:dtype. newbyteorder
numpy:broadcast. reset
numpy:ndindex. ndincr
numpy:flatiter. copy
numpy:nditer. close copy enable_external_loop iternext remove_axis remove_multi_index reset
numpy:void. getfield setfield
numpy:float16. as_integer_ratio is_integer
numpy:float32. as_integer_ratio is_integer
numpy:float64. as_integer_ratio is_integer
numpy:longdouble. as_integer_ratio is_integer
numpy:integer. is_integer
numpy:int8. bit_count
numpy:int16. bit_count
numpy:int32. bit_count
numpy:int64. bit_count
numpy:longlong. bit_count
numpy:uint8. bit_count
numpy:uint16. bit_count
numpy:uint32. bit_count
numpy:uint64. bit_count
numpy:ulonglong. bit_count
numpy.linalg: LinAlgError cholesky cond cross det diagonal eig eigh eigvals eigvalsh inv lstsq
    matmul matrix_norm matrix_power matrix_rank matrix_transpose multi_dot norm outer pinv qr
    slogdet solve svd svdvals tensordot tensorinv tensorsolve trace vecdot vector_norm
numpy.fft: fft fft2 fftfreq fftn fftshift hfft ifft ifft2 ifftn ifftshift ihfft irfft irfft2
    irfftn rfft rfft2 rfftfreq rfftn
numpy.random: beta binomial bytes chisquare choice dirichlet exponential f gamma geometric
    get_state gumbel hypergeometric laplace logistic lognormal logseries multinomial
    multivariate_normal negative_binomial noncentral_chisquare noncentral_f normal pareto
    permutation poisson power rand randint randn random random_integers random_sample ranf
    rayleigh sample seed set_state shuffle standard_cauchy standard_exponential standard_gamma
    standard_normal standard_t triangular uniform vonmises wald weibull zipf
numpy.lib.stride_tricks: sliding_window_view    # bounds-checked (unlike as_strided)
numpy.lib.scimath: arccos arcsin arctanh log log10 log2 logn power sqrt
numpy.lib.array_utils: normalize_axis_index normalize_axis_tuple
numpy.exceptions: AxisError ComplexWarning DTypePromotionError ModuleDeprecationWarning
    TooHardError VisibleDeprecationWarning
# private names that NumPy's own pickles of scalars, dtypes and arrays name
numpy._core.multiarray: _reconstruct scalar
# gradwire's dtype objects pickle by name: an RPC may pass dtype=gradwire.float64
gradwire._dtypes: bool cdouble cfloat complex128 complex64 double float float16 float32
    float64 half int int16 int32 int64 int8 long uint8
numpy._core.numeric: _frombuffer

# -- gradwire: tensors, autograd, nn, optim ---------------------------------------------------
gradwire: Device Tensor abs add allclose amax arange argmax argmin as_tensor cat chunk clamp clip
    clone concat conj cos detach device div dtype empty empty_like enable_grad eq equal exp eye
    flatten from_numpy full full_like ge get_default_dtype gt imag inference_mode
    is_cuda_available is_grad_enabled is_inference_mode_enabled is_tensor le linspace log
    log_softmax lt manual_seed masked_fill matmul max maximum mean min minimum mm mul narrow ne
    neg no_grad numel ones ones_like permute pow prod rand rand_like randint randn randn_like
    real relu reshape seed select set_grad_enabled sgn sigmoid sign sin softmax split sqrt
    square squeeze stack std sub sum t tanh tensor transpose unsqueeze var where zeros
    zeros_like
gradwire:Tensor. abs add add_ all allclose amax any argmax argmin backward bool chunk clamp clamp_ clip
    clone conj contiguous copy_ cos cpu cuda detach detach_ dim div div_ divide double
    element_size eq equal exp expand expand_as fill_ flatten float ge gt half int is_complex
    is_contiguous is_floating_point is_inference is_shared item le log log_softmax long lt
    masked_fill matmul max maximum mean min minimum mm mul mul_ multiply narrow ne neg negative
    nelement numel numpy permute pow prod relu requires_grad_ reshape retain_grad select sgn
    sigmoid sign sin size softmax split sqrt square squeeze std stride sub sub_ subtract sum
    swapaxes t tanh to tolist transpose true_divide type unsqueeze var view view_as_self where
    zero_
gradwire.nn: CrossEntropyLoss Identity Linear MSELoss Module Parameter ReLU Sequential Sigmoid
    Tanh
gradwire.nn:Module. add_module children eval extra_repr forward load_state_dict modules
    named_children named_modules named_parameters parameters register_parameter requires_grad_
    state_dict to train zero_grad __call__
gradwire.nn:Linear. forward extra_repr
gradwire.nn:Sequential. forward
gradwire.nn:Identity. forward
gradwire.nn:ReLU. forward
gradwire.nn:Sigmoid. forward
gradwire.nn:Tanh. forward
gradwire.nn:MSELoss. forward
gradwire.nn:CrossEntropyLoss. forward
gradwire.nn.functional: cross_entropy linear log_softmax mse_loss nll_loss relu sigmoid softmax
    tanh
gradwire.nn.init: kaiming_uniform_ normal_ ones_ uniform_ xavier_uniform_ zeros_
gradwire.optim: Adam Optimizer SGD
gradwire.optim:Optimizer. add_param_group load_state_dict state_dict step step_with_grads
    zero_grad
gradwire.optim:SGD. step step_with_grads
gradwire.optim:Adam. step step_with_grads
# optim: AdamW, RMSprop, Adagrad, lr schedulers; autograd: anomaly and threading state (reads)
gradwire.optim: AdamW RMSprop Adagrad
gradwire.optim.lr_scheduler: LRScheduler StepLR
gradwire.optim.lr_scheduler:LRScheduler. get_last_lr get_lr load_state_dict state_dict step
gradwire.optim.lr_scheduler:StepLR. get_lr
# issue 25 (PyTorch's RPC test suite): the address of a tensor's storage
gradwire:Tensor. data_ptr
gradwire: Generator
gradwire:Generator. initial_seed manual_seed seed
gradwire.optim: Adadelta Adamax Rprop
gradwire: bmm nonzero
gradwire:Tensor. bmm nonzero
gradwire.linalg: multi_dot
gradwire.nn: L1Loss
gradwire.nn:L1Loss. forward
gradwire.nn.functional: l1_loss
gradwire.distributed.rpc._gather: _gather_put    # the leader's side of rpc.api._all_gather
gradwire.distributed.rpc._gather: _deliver_round    # a follower's side of rpc.api._all_gather
# profile_cluster: start and stop recording on a worker (one session at a time, bounded events)
gradwire.distributed.profile: _start_on_worker _stop_on_worker
gradwire.autograd: is_anomaly_enabled is_anomaly_check_nan_enabled is_multithreading_enabled
gradwire.autograd.anomaly_mode: AnomalyError
# nn layers: normalisation, activations, containers, losses, Module state; distributions
gradwire: BoolTensor DoubleTensor FloatTensor IntTensor LongTensor multinomial
gradwire:Tensor. multinomial relu_
gradwire.nn: BatchNorm1d BatchNorm2d Flatten LayerNorm LogSoftmax ModuleDict ModuleList NLLLoss
    Softmax
gradwire.nn:Module. apply buffers cpu cuda double float half named_buffers register_buffer
    register_module
gradwire.nn:BatchNorm1d. forward extra_repr reset_parameters reset_running_stats
gradwire.nn:BatchNorm2d. forward extra_repr reset_parameters reset_running_stats
gradwire.nn:LayerNorm. forward extra_repr reset_parameters
gradwire.nn:Flatten. forward extra_repr
gradwire.nn:Softmax. forward extra_repr
gradwire.nn:LogSoftmax. forward extra_repr
gradwire.nn:NLLLoss. forward
gradwire.nn:ReLU. extra_repr
gradwire.nn:ModuleList. append extend insert pop forward
gradwire.nn:ModuleDict. clear items keys pop update values forward
gradwire.nn.functional: batch_norm flatten layer_norm
gradwire.nn.init: calculate_gain constant_ kaiming_normal_ xavier_normal_
gradwire.distributions: Categorical Distribution
gradwire.distributions:Categorical. entropy enumerate_support log_prob sample
gradwire.distributions:Distribution. entropy log_prob sample
# gather/scatter/index_select/view_as and the in-place random fills (client/_tensor_scatter.py)
gradwire:Tensor. gather index_select normal_ random_ scatter scatter_ uniform_ view_as
gradwire:Tensor. floor_divide remainder
gradwire: floor_divide remainder
# nn convolution and pooling (client/nn/conv.py, client/nn/pooling.py)
gradwire.nn: AdaptiveAvgPool2d AvgPool2d Conv2d MaxPool2d
gradwire.nn:Conv2d. extra_repr forward reset_parameters
gradwire.nn:MaxPool2d. extra_repr forward
gradwire.nn:AvgPool2d. extra_repr forward
gradwire.nn:AdaptiveAvgPool2d. extra_repr forward
gradwire.nn.functional: adaptive_avg_pool2d avg_pool2d conv2d max_pool2d
# sparse COO tensors (client/_sparse_methods.py, client/sparse/): arrays in, arrays out
gradwire: layout sparse_coo sparse_coo_tensor strided
gradwire.sparse: sum
gradwire:Tensor. coalesce dense_dim indices is_coalesced sparse_dim sparse_mask to_dense
    to_sparse values
gradwire.optim: SparseAdam
gradwire.optim:SparseAdam. step step_with_grads
# nn embeddings, recurrent layers, dropout (client/nn/sparse.py, rnn.py, dropout.py)
gradwire.nn: Dropout Dropout2d Embedding EmbeddingBag GRU GRUCell LSTM LSTMCell RNN RNNBase RNNCell
    RNNCellBase
gradwire.nn:Embedding. extra_repr forward from_pretrained reset_parameters
gradwire.nn:EmbeddingBag. extra_repr forward from_pretrained reset_parameters
gradwire.nn:RNNBase. extra_repr flatten_parameters forward reset_parameters
gradwire.nn:RNNCellBase. extra_repr reset_parameters
gradwire.nn:RNN. extra_repr
gradwire.nn:RNNCell. forward
gradwire.nn:LSTMCell. forward
gradwire.nn:GRUCell. forward
gradwire.nn:Dropout. extra_repr forward
gradwire.nn:Dropout2d. extra_repr forward
gradwire.nn.functional: dropout dropout2d embedding embedding_bag
gradwire.autograd: Function FunctionCtx backward enable_grad grad gradcheck gradgradcheck
    inference_mode is_grad_enabled is_inference_mode_enabled no_grad once_differentiable
    set_grad_enabled
gradwire.autograd:Function. apply backward forward
gradwire.autograd:FunctionCtx. mark_dirty mark_non_differentiable save_for_backward
    set_materialize_grads
gradwire.futures: Future collect_all wait_all
gradwire.futures:Future. done exception value wait
gradwire.errors: ArgumentError AuthenticationError CallbackError FuturePicklingError GradwireError InvalidFutureStateError
    MessageTooLargeError PolicyError RRefError RRefLeakError RemoteError RpcError RpcInitError
    RpcNotInitializedError RpcShutdownError RpcTimeoutError SerializationError
    TooManyRequestsError UnknownWorkerError WorkerDepartedError WorkerUnavailableError

# -- gradwire: the RPC helpers that only read state --------------------------------------------
gradwire.distributed.rpc: RRef WorkerInfo get_debug_info get_rpc_timeout get_worker_info
    get_worker_infos is_available is_initialized
gradwire.distributed.rpc:RRef. backward confirmed_by_owner is_owner local_value owner owner_name
    to_here
gradwire.distributed.rpc.functions: async_execution
gradwire.distributed.rpc.internal: PythonUDF    # a record (func, args, kwargs): a namedtuple
gradwire.distributed.autograd: ContextError backward context get_gradients is_available
# gradwire's exceptions defined in private modules: they travel back to callers with their type
gradwire._runtime.rref.errors: RRefProtocolError UnknownRRefError
gradwire.autograd.gradcheck: GradcheckError
gradwire.multiprocessing: AuthenticationError BufferTooShort ProcessError ProcessException
    ProcessExitedException ProcessRaisedException TimeoutError

# -- the standard library ------------------------------------------------------------------------
operator: abs add and_ concat contains countOf eq floordiv ge getitem gt iadd iand iconcat
    ifloordiv ilshift imatmul imod imul index indexOf inv invert ior ipow irshift is_ is_not isub
    itruediv ixor le length_hint lshift lt matmul mod mul ne neg not_ or_ pos pow rshift sub
    truediv truth xor
math: acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist erf
    erfc exp exp2 expm1 fabs factorial floor fmod frexp fsum gamma gcd hypot isclose isfinite
    isinf isnan isqrt lcm ldexp lgamma log log10 log1p log2 modf nextafter perm pow prod radians
    remainder sin sinh sqrt tan tanh trunc ulp
collections: Counter OrderedDict defaultdict deque
datetime: date datetime time timedelta timezone
fractions: Fraction
decimal: Decimal
uuid: UUID
functools: reduce
copyreg: _reconstructor
"""
)

#: Listed names that a supported release lacks, by release: NumPy 2.4 removed deprecated names
#: that 2.2 and 2.3 still have (``in1d``, ``trapz``, ``tostring``, ``ndindex.ndincr``; the same
#: computations as ``isin``, ``trapezoid``, ``tobytes``), and Python 3.10's ``math`` lacks two.
#: The resolve test checks that every listed name resolves except those absent from an installed
#: release, and that each of these really is absent there, so this table stays true.
ABSENT: dict[str, frozenset[str]] = {
    "numpy 2.3": _names("numpy:ndarray. tostring"),
    "numpy 2.4": _names(
        """
numpy: in1d trapz
numpy:ndarray. tostring
numpy:generic. tostring
numpy:ndindex. ndincr
"""
    ),
    "python 3.10": _names("math: cbrt exp2"),
}

#: Reviewed and refused, with the reason. Everything not in ALLOWED is refused anyway; this list
#: records the review, so the completeness test can tell a new name from a refused one.
REFUSED: frozenset[str] = _names(
    """
# files
numpy: load loadtxt save savetxt savez savez_compressed genfromtxt fromfile fromregex memmap
numpy:ndarray. tofile dump dumps
numpy:generic. tofile dump dumps
numpy.lib.npyio: *
numpy.lib.format: *
# introspection that reads files, prints or reveals the host (paths, build, CPU)
numpy: info show_config show_runtime get_include test
numpy:nditer. debug_print
# raw memory: views from caller-chosen strides, foreign pointers, addresses
numpy.lib.stride_tricks: as_strided
numpy: from_dlpack
numpy.lib.array_utils: byte_bounds
numpy.ctypeslib: *
numpy:ndarray. setflags
numpy:generic. setflags
# process-wide settings and callbacks that run later, outside the call
numpy: seterr seterrcall setbufsize set_printoptions printoptions errstate geterrcall vectorize
    frompyfunc
# bmat evaluates names from its caller's frame; the rest are outside the reviewed surface
numpy: bmat matrix asmatrix recarray record poly1d
numpy.lib: *
numpy.random: BitGenerator Generator MT19937 PCG64 PCG64DXSM Philox RandomState SFC64
    SeedSequence default_rng
numpy.char: *
numpy.strings: *
numpy.rec: *
numpy.ma: *
numpy.polynomial: *
numpy.dtypes: *
numpy.lib.mixins: *
numpy.lib.introspect: *
numpy.lib.recfunctions: *
numpy.typing: *
# test helpers: spawn processes, touch files
numpy.testing: *
numpy.f2py: *

# gradwire: host-touching API (processes, sockets, shared memory, other workers, the CLI)
gradwire.multiprocessing: Array Barrier BoundedSemaphore Condition Event JoinableQueue Lock
    Manager Pipe Pool Process ProcessContext Queue RLock RawArray RawValue Semaphore SimpleQueue
    SpawnContext Value active_children allow_connection_pickling cpu_count current_process
    freeze_support get_all_sharing_strategies get_all_start_methods get_context get_logger
    get_sharing_strategy get_start_method init_reductions is_shared log_to_stderr
    parent_process set_executable set_forkserver_preload set_sharing_strategy set_start_method
    share_memory_ spawn start_processes
gradwire.distributed.rpc: init_rpc shutdown rpc_sync rpc_async remote GrpcRpcBackendOptions
    RpcBackendOptions TensorPipeRpcBackendOptions BackendType set_rpc_timeout
gradwire.distributed.rpc:RRef. rpc_sync rpc_async remote
gradwire.distributed.optim: DistributedOptimizer
gradwire.distributed.nn: RemoteModule
gradwire:Tensor. share_memory_
gradwire: save load    # files
gradwire.cli: *
gradwire.server: *
gradwire.demo: *
# gradwire: process-wide settings and callbacks that run later
gradwire: set_default_dtype set_num_threads
gradwire: get_num_threads    # reads the host's BLAS thread pools (threadpoolctl loads libraries)
gradwire:Tensor. register_hook
gradwire.nn:Module. register_forward_hook register_forward_pre_hook share_memory
gradwire.futures: blocking_hook blocking_region set_blocking_hook
gradwire.futures:Future. add_done_callback then set_exception set_result
gradwire.errors: remote_error_type callback_error    # they make classes at run time
gradwire.autograd: detect_anomaly set_detect_anomaly set_multithreading_enabled
gradwire.optim.lr_scheduler: LambdaLR    # calls the peer-chosen lr_lambda later, unguarded
"""
)

#: gradwire's own dispatchers that a peer names: each resolves what it runs through the policy
#: itself (so it runs unguarded, and guards the callable it resolves when that one needs it).
ENTRY_POINTS: frozenset[str] = frozenset(
    {
        "gradwire.distributed.rpc.rref:_call_method",
        "gradwire.distributed.rpc.rref:_backward_on_owner",
        # returns only type(value) of an RRef the caller holds (RRef._get_type of a user)
        "gradwire.distributed.rpc.rref:_rref_typeof_on_owner",
        "gradwire.distributed.optim.optimizer:_new_local_optimizer",
        "gradwire.distributed.optim.optimizer:_local_step",
        "gradwire.distributed.nn.remote_module:_ready_module",
        "gradwire.distributed.nn.remote_module:_param_rrefs",
    }
)

#: Builtins that neither evaluate code, touch files nor reach into interpreter internals; the
#: public members of the builtin types among them are allowed too (``list.append``), except
#: REFUSED_BUILTIN_MEMBERS.
SAFE_BUILTINS: frozenset[str] = frozenset(
    """abs all any ascii bin bool bytearray bytes callable chr complex dict divmod enumerate filter
    float format frozenset hash hex int isinstance issubclass iter len list map max min next
    object oct ord pow range repr reversed round set slice sorted str sum tuple zip
    NotImplemented Ellipsis""".split()
)

#: ``str.format`` walks attributes of its arguments (``"{0.__class__}"``): a read of anything
#: reachable from an argument, RRefs included.
REFUSED_BUILTIN_MEMBERS: frozenset[str] = frozenset(
    {"str.format", "str.format_map", "object.__reduce__", "object.__reduce_ex__"}
)
