"""gradwire.nn: modules, parameters and losses, enough to train models like in PyTorch."""

from __future__ import annotations

from . import functional, init
from .activation import LogSoftmax, Softmax
from .container import ModuleDict, ModuleList
from .conv import Conv2d
from .dropout import Dropout, Dropout2d
from .flatten import Flatten
from .loss import NLLLoss
from .modules import (
    CrossEntropyLoss,
    Identity,
    L1Loss,
    Linear,
    Module,
    MSELoss,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
)
from .normalization import BatchNorm1d, BatchNorm2d, LayerNorm
from .parameter import Parameter
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .sparse import Embedding, EmbeddingBag

__all__ = [
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    "Dropout",
    "Dropout2d",
    "Embedding",
    "EmbeddingBag",
    "RNNBase",
    "RNN",
    "LSTM",
    "GRU",
    "RNNCellBase",
    "RNNCell",
    "LSTMCell",
    "GRUCell",
    "Module",
    "Parameter",
    "Linear",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "Identity",
    "Sequential",
    "MSELoss",
    "L1Loss",
    "CrossEntropyLoss",
    "functional",
    "init",
    "BatchNorm1d",
    "BatchNorm2d",
    "LayerNorm",
    "Flatten",
    "Softmax",
    "LogSoftmax",
    "NLLLoss",
    "ModuleList",
    "ModuleDict",
]
