"""Vertex functions shared by the runtime tests: a binary Tree-LSTM (Cavs Fig. 4), a
child-sum Tree-LSTM (Tai et al.), a generic cell that gathers ``arity`` children, the
benchmark's Tree-LSTM that embeds pulled word ids inside the cell, an RNTN (Socher et al.
2013: a bilinear term xᵀ V_i x, whose rows are matrices inside the level loop), and a
Tree-LSTM as a recursive definition (a leaf kind over all its rows, an internal kind by
levels)."""

import minicavs as mc


def binary_tree_lstm(E, H, rng, dtype="float64", push=True, options=None):
    """Binary Tree-LSTM: gates = W x + U [h_l, h_r] + b; c = i⊙u + f_l⊙c_l + f_r⊙c_r."""
    W = mc.Parameter(rng.standard_normal((E, 5 * H)).astype(dtype) * 0.4, name="W")
    U = mc.Parameter(rng.standard_normal((2 * H, 5 * H)).astype(dtype) * 0.4, name="U")
    b = mc.Parameter(rng.standard_normal(5 * H).astype(dtype) * 0.1, name="b")
    Wo = mc.Parameter(rng.standard_normal((H, 3)).astype(dtype) * 0.5, name="Wo")

    def cell(v):
        x = v.pull()
        h_l, c_l = mc.split(v.gather(0), 2)
        h_r, c_r = mc.split(v.gather(1), 2)
        gates = x @ W + mc.concat([h_l, h_r]) @ U + b
        i, f_l, f_r, o, u = mc.split(gates, 5)
        c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
        h = mc.sigmoid(o) * mc.tanh(c)
        v.scatter(mc.concat([h, c]))
        if push:
            v.push(h @ Wo)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(2 * H,),
                          push_shape=(3,) if push else None, arity=2, dtype=dtype,
                          options=options)
    return F, [W, U, b, Wo] if push else [W, U, b]


def child_sum_tree_lstm(E, H, rng, dtype="float64", options=None):
    """Child-sum Tree-LSTM: one forget gate per child, f_k = σ(W_f x + U_f h_k + b_f)."""
    W = mc.Parameter(rng.standard_normal((E, 3 * H)).astype(dtype) * 0.4, name="W")
    U = mc.Parameter(rng.standard_normal((H, 3 * H)).astype(dtype) * 0.4, name="U")
    Wf = mc.Parameter(rng.standard_normal((E, H)).astype(dtype) * 0.4, name="Wf")
    Uf = mc.Parameter(rng.standard_normal((H, H)).astype(dtype) * 0.4, name="Uf")
    bf = mc.Parameter(rng.standard_normal(H).astype(dtype) * 0.1, name="bf")
    Wo = mc.Parameter(rng.standard_normal((H, 2)).astype(dtype) * 0.5, name="Wo")

    def cell(v):
        x = v.pull()
        h_sum = v.gather_sum(lambda child: mc.split(child, 2)[0])
        i, o, u = mc.split(x @ W + h_sum @ U, 3)
        forget_x = x @ Wf + bf  # per vertex, broadcast to the vertex's edges below

        def forget_times_cell(child):
            h_k, c_k = mc.split(child, 2)
            return mc.sigmoid(forget_x + h_k @ Uf) * c_k

        c = mc.sigmoid(i) * mc.tanh(u) + v.gather_sum(forget_times_cell)
        h = mc.sigmoid(o) * mc.tanh(c)
        v.scatter(mc.concat([h, c]))
        v.push(h @ Wo)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(2 * H,), push_shape=(2,),
                          dtype=dtype, options=options)
    return F, [W, U, Wf, Uf, bf, Wo]


def k_ary_cell(E, H, arity, rng, dtype="float64", options=None):
    """h = tanh(x W + Σ_k gather(k) U_k): exercises gather(k) for any declared arity."""
    W = mc.Parameter(rng.standard_normal((E, H)).astype(dtype) * 0.5, name="W")
    Us = [mc.Parameter(rng.standard_normal((H, H)).astype(dtype) * 0.5, name=f"U{k}")
          for k in range(arity)]

    def cell(v):
        total = v.pull() @ W
        for k, U in enumerate(Us):
            total = total + v.gather(k) @ U
        h = mc.tanh(total)
        v.scatter(h)
        v.push(h * h)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), push_shape=(H,),
                          arity=arity, dtype=dtype, options=options)
    return F, [W] + Us


def embedding_tree_lstm(E, H, vocab, rng, dtype="float64", options=None, classes=3, scale=1.0):
    """The benchmark's Tree-LSTM: a word id is pulled and embedded inside the cell (-1, at
    internal vertices, embeds to zeros), so rows of the embedding, of x W and of the table's
    gradient are zero there; it scatters [h, c] and pushes class logits."""
    def param(shape, spread, name):
        return mc.Parameter((rng.standard_normal(shape) * spread * scale).astype(dtype), name=name)

    table = param((vocab, E), 1.0, "table")
    W, U = param((E, 5 * H), 0.4, "W"), param((2 * H, 5 * H), 0.4, "U")
    b, Wo = param(5 * H, 0.1, "b"), param((H, classes), 0.5, "Wo")

    def cell(v):
        x = mc.embedding(table, v.pull())
        h_l, c_l = mc.split(v.gather(0), 2)
        h_r, c_r = mc.split(v.gather(1), 2)
        i, f_l, f_r, o, u = mc.split(x @ W + mc.concat([h_l, h_r]) @ U + b, 5)
        c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
        h = mc.sigmoid(o) * mc.tanh(c)
        v.scatter(mc.concat([h, c]))
        v.push(h @ Wo)

    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(2 * H,),
                          push_shape=(classes,), arity=2, dtype=dtype, options=options)
    return F, [table, W, U, b, Wo]


def rntn(E, H, rng, dtype="float64", options=None):
    """RNTN: x = [h_l, h_r], h = tanh(p W + x U + xᵀ V x + b), with xᵀ V_i x for every slice i of
    V (H, 2H, 2H) written as (x V) seen as an (H, 2H) matrix per vertex, times x, summed."""
    W = mc.Parameter(rng.standard_normal((E, H)).astype(dtype) * 0.5, name="W")
    U = mc.Parameter(rng.standard_normal((2 * H, H)).astype(dtype) * 0.4, name="U")
    V = mc.Parameter(rng.standard_normal((H, 2 * H, 2 * H)).astype(dtype) * 0.3, name="V")
    b = mc.Parameter(rng.standard_normal(H).astype(dtype) * 0.1, name="b")

    def cell(v):
        x = mc.concat([v.gather(0), v.gather(1)])
        v_flat = mc.reshape(mc.transpose(V, (1, 0, 2)), (2 * H, H * 2 * H))
        bilinear = mc.sum(mc.reshape(x @ v_flat, (H, 2 * H)) * x, axis=-1)
        h = mc.tanh(v.pull() @ W + x @ U + bilinear + b)
        v.scatter(h)
        v.push(h * h)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), push_shape=(H,),
                          arity=2, dtype=dtype, options=options)
    return F, [W, U, V, b]


def recursive_tree_lstm(E, H, rng, dtype="float64", options=None, classes=3):
    """A binary Tree-LSTM written recursively: a leaf reads three gates of ``x W + b`` (no
    child product), an internal vertex ``[h_l, h_r] U + b``; each pushes ``h W_out`` and
    returns ``[h, c]``. Returns the function and its parameters (W, U, b, W_out)."""
    W = mc.Parameter(rng.standard_normal((E, 5 * H)).astype(dtype) * 0.5, name="W")
    U = mc.Parameter(rng.standard_normal((2 * H, 5 * H)).astype(dtype) * 0.5, name="U")
    b = mc.Parameter(rng.standard_normal(5 * H).astype(dtype), name="b")
    W_out = mc.Parameter(rng.standard_normal((H, classes)).astype(dtype), name="W_out")

    @mc.recursive(scatter_shape=(2 * H,), pull_shape=(E,), push_shape=(classes,), arity=2,
                  dtype=dtype, options=options)
    def model(node):
        if node.is_leaf:
            i, _, _, o, u = mc.split(node.pull() @ W + b, 5)
            c = mc.sigmoid(i) * mc.tanh(u)
        else:
            (h_l, c_l), (h_r, c_r) = [mc.split(model(k), 2) for k in node.children]
            i, f_l, f_r, o, u = mc.split(mc.concat([h_l, h_r]) @ U + b, 5)
            c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
        h = mc.sigmoid(o) * mc.tanh(c)
        node.push(h @ W_out)
        return mc.concat([h, c])

    return model, [W, U, b, W_out]
