"""Text models: a causal transformer language model, a transformer classifier, a residual LSTM.

All three take int token ids of shape `(seq_len,)` and output logits. Each of their
`blocks` ends in one named layer, `block{i}_out` (1-based), which is a natural pipeline
cut: after it only the block's output crosses (and, in the classifiers, the padding mask).

The classifiers ignore padding (token id 0) through an explicit boolean mask, the
`padding_mask` layer's output, passed as an argument to the layers that need it
(`value_mask=` of the attention, `mask=` of the LSTMs and the pooling). No Keras mask is
attached to any tensor (no `mask_zero=True`), so nothing depends on one, and the mask
crosses a cut as the tensor it is.
"""

import numbers

import keras
from keras import layers

from .text_layers import PaddingMask, PositionEmbedding

MLP_RATIO = 4
"""A transformer block's MLP has `MLP_RATIO * width` hidden units unless told otherwise."""


def _check_int(value, arg, model, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(
            f"`{arg}` of model '{model}' must be an int >= {minimum}. Received: {arg}={value!r}"
        )
    return int(value)


def _check_transformer(model, blocks, width, heads, mlp_width):
    """Checks the transformer options; returns `(blocks, width, heads, mlp_width)`."""
    blocks = _check_int(blocks, "blocks", model)
    width = _check_int(width, "width", model)
    heads = _check_int(heads, "heads", model)
    if width % heads:
        raise ValueError(
            f"`width` of model '{model}' must be divisible by `heads` (each head has "
            f"width // heads units). Received: width={width}, heads={heads}"
        )
    mlp_width = MLP_RATIO * width if mlp_width is None else _check_int(
        mlp_width, "mlp_width", model
    )
    return blocks, width, heads, mlp_width


def _transformer_block(x, index, heads, mlp_width, causal=False, padding=None):
    """A pre-norm block: `x + attention(LN(x))`, then `x + MLP(LN(x))`, ending in `_out`."""
    name = f"block{index}"
    width = x.shape[-1]
    h = layers.LayerNormalization(name=f"{name}_ln1")(x)
    attention = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attn")
    if causal:
        h = attention(h, h, use_causal_mask=True)
    else:
        h = attention(h, h, value_mask=padding)
    x = layers.Add(name=f"{name}_add")([x, h])
    h = layers.LayerNormalization(name=f"{name}_ln2")(x)
    h = layers.Dense(mlp_width, activation="gelu", name=f"{name}_mlp1")(h)
    h = layers.Dense(width, name=f"{name}_mlp2")(h)
    return layers.Add(name=f"{name}_out")([x, h])


def _embed(tokens, vocab_size, width, positions):
    """`token_embedding` (no Keras mask), then `position_embedding` if `positions`."""
    x = layers.Embedding(vocab_size, width, name="token_embedding")(tokens)
    if positions:
        x = PositionEmbedding(tokens.shape[1], name="position_embedding")(x)
    return x


def transformer_lm(input_shape, num_classes, *, blocks=4, width=64, heads=4, mlp_width=None):
    """Builds a small causal transformer language model (next-token prediction).

    `input` (int token ids), `token_embedding` and `position_embedding` (learned), then
    `blocks` pre-norm blocks `block{i}` (1-based): `_ln1`, `_attn` (causal multi-head
    self-attention, `use_causal_mask=True`), `_add`, `_ln2`, `_mlp1` (GELU), `_mlp2` and
    `_out` (the block's last add, the only tensor crossing a cut after it); then
    `final_ln` and `predictions`, logits over the vocabulary at every position. The
    vocabulary is `num_classes` (there is no `vocab_size` option): token ids are in
    `[0, num_classes)`, and the labels are the next ids, shape `(batch, seq_len)`.
    Sequences are taken to be full length (no padding mask).

    Args:
        input_shape: `(seq_len,)`.
        num_classes: the vocabulary size (input ids and predicted classes).
        blocks: number of transformer blocks, an int >= 1.
        width: the model width (embedding and block output units), an int >= 1
            divisible by `heads`.
        heads: attention heads per block, an int >= 1 (each `width // heads` wide).
        mlp_width: hidden units of each block's MLP, an int >= 1; None means
            `4 * width`.

    Returns:
        A functional `keras.Model` named `"transformer_lm"` whose output has shape
        `(None, seq_len, num_classes)`.

    Raises:
        ValueError: if an option is not a valid int, or `width` is not divisible by
            `heads`.
    """
    blocks, width, heads, mlp_width = _check_transformer(
        "transformer_lm", blocks, width, heads, mlp_width
    )
    tokens = keras.Input(shape=tuple(input_shape), dtype="int32", name="input")
    x = _embed(tokens, num_classes, width, positions=True)
    for index in range(1, blocks + 1):
        x = _transformer_block(x, index, heads, mlp_width, causal=True)
    x = layers.LayerNormalization(name="final_ln")(x)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(tokens, outputs, name="transformer_lm")


def transformer_classifier(
    input_shape, num_classes, *, vocab_size, blocks=4, width=64, heads=4, mlp_width=None
):
    """Builds a small transformer sequence classifier that ignores padding (id 0).

    `input` (int token ids), `padding_mask` (True at real tokens), `token_embedding`,
    `position_embedding`, then `blocks` pre-norm blocks `block{i}` with the layers of
    `transformer_lm`'s blocks but non-causal attention that does not attend to padding
    (`value_mask=` the padding mask); then `final_ln`, `avg_pool` (the mean over the real
    tokens) and `predictions`. After `block{i}_out` two tensors cross a cut: the block's
    output and the padding mask.

    Args:
        input_shape: `(seq_len,)`.
        num_classes: number of classes (units of the `predictions` layer).
        vocab_size: number of token ids, padding id 0 included, an int >= 2.
        blocks, width, heads, mlp_width: as for `transformer_lm`.

    Returns:
        A functional `keras.Model` named `"transformer_classifier"` that outputs logits
        of shape `(None, num_classes)`.

    Raises:
        ValueError: if an option is not a valid int, or `width` is not divisible by
            `heads`.
    """
    model = "transformer_classifier"
    vocab_size = _check_int(vocab_size, "vocab_size", model, minimum=2)
    blocks, width, heads, mlp_width = _check_transformer(model, blocks, width, heads, mlp_width)
    tokens = keras.Input(shape=tuple(input_shape), dtype="int32", name="input")
    padding = PaddingMask(name="padding_mask")(tokens)
    x = _embed(tokens, vocab_size, width, positions=True)
    for index in range(1, blocks + 1):
        x = _transformer_block(x, index, heads, mlp_width, padding=padding)
    x = layers.LayerNormalization(name="final_ln")(x)
    x = layers.GlobalAveragePooling1D(name="avg_pool")(x, mask=padding)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(tokens, outputs, name=model)


def residual_lstm(input_shape, num_classes, *, vocab_size, blocks=4, width=64):
    """Builds stacked LSTMs with residual connections, a classifier that ignores padding.

    `input` (int token ids), `padding_mask` (True at real tokens), `token_embedding`,
    then `blocks` blocks `block{i}` (1-based): `_lstm` (an LSTM of `width` units over the
    whole sequence, skipping padding: `mask=` the padding mask) and `_out`, the residual
    sum `x + LSTM(x)`; then `avg_pool` (the mean over the real tokens) and
    `predictions`. After `block{i}_out` two tensors cross a cut: the block's output and
    the padding mask.

    Args:
        input_shape: `(seq_len,)`.
        num_classes: number of classes (units of the `predictions` layer).
        vocab_size: number of token ids, padding id 0 included, an int >= 2.
        blocks: number of LSTM blocks, an int >= 1.
        width: units of the embedding and of every LSTM, an int >= 1.

    Returns:
        A functional `keras.Model` named `"residual_lstm"` that outputs logits of shape
        `(None, num_classes)`.

    Raises:
        ValueError: if an option is not a valid int.
    """
    model = "residual_lstm"
    vocab_size = _check_int(vocab_size, "vocab_size", model, minimum=2)
    blocks = _check_int(blocks, "blocks", model)
    width = _check_int(width, "width", model)
    tokens = keras.Input(shape=tuple(input_shape), dtype="int32", name="input")
    padding = PaddingMask(name="padding_mask")(tokens)
    x = _embed(tokens, vocab_size, width, positions=False)
    for index in range(1, blocks + 1):
        h = layers.LSTM(width, return_sequences=True, name=f"block{index}_lstm")(
            x, mask=padding
        )
        x = layers.Add(name=f"block{index}_out")([x, h])
    x = layers.GlobalAveragePooling1D(name="avg_pool")(x, mask=padding)
    outputs = layers.Dense(num_classes, name="predictions")(x)
    return keras.Model(tokens, outputs, name=model)
