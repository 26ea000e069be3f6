#!/usr/bin/python3
"""Writes the golden fixtures that tests/test_philox.cpp, tests/test_checkpoint.cpp and
tests/test_cpu_replica.cpp compare mnist_mt against.

Regenerate (deterministic: the same bytes every run) with Debian's python3-torch 1.13:
    /usr/bin/python3 tests/golden/gen_golden.py
It writes, next to itself:
  torch_init.safetensors  The template's Net with PyTorch's default initialisation
      (torch.manual_seed(TORCH_SEED)), written here as a mnist_mt checkpoint: state-dict
      names and shapes, F32, metadata epoch 0, step 0, seed TORCH_SEED. safetensors is
      written by hand (struct + json), so the safetensors package is not needed.
  golden.safetensors  From those weights and a batch of 8 uint8 images with labels:
      images, labels           the batch (random uint8, torch.Generator seeded BATCH_SEED)
      logprobs, loss           forward with dropout off (eval-mode dropout), mean NLL
      grad.<name>              d(loss)/d(param), train-mode gradients, dropout off
      step3.<name>, momentum3.<name>
                               params and momentum buffers after 3 torch.optim.SGD steps
                               (lr 0.01, momentum 0.9, weight_decay 1e-4) on that batch
      torch_init.<name>        every 97th initial parameter, to check torch_init.safetensors
      philox.*                 Philox4x32-10 known answers: Random123's published vectors
                               plus more from the independent implementation below
      dropout.*                dropout_keep() decisions from that implementation
      init.<name>              every 97th value of init_parameters(INIT_SEED), from it
  The fc1.weight entries of grad., step3. and momentum3. hold every 29th element of the
  flattened tensor (metadata fc1_weight_stride) to keep the files small.

The expected values are computed in float64 from the float32 weights and the float32
normalised input (the same fp32 operations as the C++ normalisation), so they carry no
fp32 rounding of their own; the C++ tests compare their fp32 results against them.
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
# The network is the template's own definition, so the fixtures are the template's.
sys.path.insert(0, str(HERE.parent.parent / "bench" / "pytorch"))
from demo import Net  # noqa: E402

TORCH_SEED = 20240611
BATCH_SEED = 7
INIT_SEED = 0x0123456789ABCDEF
BATCH = 8
FC1_STRIDE = 29
SAMPLE_STRIDE = 97
MEAN, STD = 0.1307, 0.3081
NAMES = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
         "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


# --- Philox4x32-10, written from Salmon et al. (SC'11), independent of philox.hpp ---
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox(ctr, key):
    c = list(ctr)
    k = list(key)
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & MASK, p1 & MASK,
             ((p0 >> 32) ^ c[3] ^ k[1]) & MASK, p0 & MASK]
        k = [(k[0] + W0) & MASK, (k[1] + W1) & MASK]
    return c


# Random123's kat_vectors for philox4x32 with 10 rounds: counter, key, expected output.
RANDOM123_KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([MASK] * 4, [MASK, MASK], [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]
STREAM_INIT, STREAM_DROPOUT0, STREAM_DROPOUT1 = 0x1A17, 0xD0, 0xD1


def uniform01(bits):
    return np.float32(bits >> 8) * np.float32(1.0 / 16777216.0)


def dropout_keep(seed, epoch, sample, stream, element, p):
    r = philox([element >> 2, sample, stream, epoch], [seed & MASK, seed >> 32])
    return bool(uniform01(r[element & 3]) >= np.float32(p))


def init_value(seed, index, i, bound):
    """Element i of parameter `index` under init_parameters(seed)."""
    r = philox([i >> 2, index, STREAM_INIT, 0], [seed & MASK, seed >> 32])
    return (np.float32(2.0) * uniform01(r[i & 3]) - np.float32(1.0)) * bound


# --- safetensors, by hand: 8-byte LE header length, JSON header, raw LE data ---
DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.uint8): "U8",
          np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64"}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def f32(t):
    return t.detach().to(torch.float32).numpy().copy()


def sampled(name, array):
    """fc1.weight thinned to every FC1_STRIDE-th element; the rest whole."""
    return array.reshape(-1)[::FC1_STRIDE].copy() if name == "fc1.weight" else array


def normalise(images):
    """The fp32 operations of the C++ normalisation (and of ToTensor + Normalize)."""
    x = images.astype(np.float32) / np.float32(255.0)
    return (x - np.float32(MEAN)) / np.float32(STD)


def philox_fixtures():
    for ctr, key, want in RANDOM123_KAT:
        assert philox(ctr, key) == want, "Philox implementation disagrees with Random123"
    rng = np.random.Generator(np.random.PCG64(11))
    counters = [kat[0] for kat in RANDOM123_KAT] + rng.integers(0, 2**32, (13, 4), dtype=np.uint64).tolist()
    keys = [kat[1] for kat in RANDOM123_KAT] + rng.integers(0, 2**32, (13, 2), dtype=np.uint64).tolist()
    out = {"philox.counter": np.array(counters, np.uint32), "philox.key": np.array(keys, np.uint32),
           "philox.output": np.array([philox(c, k) for c, k in zip(counters, keys)], np.uint32)}
    cases = 256
    seeds = rng.integers(0, 2**63, cases, dtype=np.uint64)
    epochs = rng.integers(0, 100, cases, dtype=np.uint32)
    samples = rng.integers(0, 60000, cases, dtype=np.uint32)
    streams = np.where(np.arange(cases) % 2 == 0, STREAM_DROPOUT0, STREAM_DROPOUT1).astype(np.uint32)
    elements = rng.integers(0, 9216, cases, dtype=np.uint32)
    ps = np.where(np.arange(cases) % 4 < 2, 0.25, 0.5).astype(np.float32)
    keep = [dropout_keep(int(s), int(e), int(n), int(st), int(el), float(p))
            for s, e, n, st, el, p in zip(seeds, epochs, samples, streams, elements, ps)]
    out.update({"dropout.seed": seeds, "dropout.epoch": epochs, "dropout.sample": samples,
                "dropout.stream": streams, "dropout.element": elements, "dropout.p": ps,
                "dropout.keep": np.array(keep, np.uint8)})
    return out


def init_fixtures(net):
    out = {}
    for index, (name, param) in enumerate(net.named_parameters()):
        weight = dict(net.named_parameters())[name.replace("bias", "weight")]
        fan_in = int(np.prod(weight.shape[1:]))
        bound = np.float32(1.0 / np.sqrt(np.float64(fan_in)))
        count = param.numel()
        out["init." + name] = np.array([init_value(INIT_SEED, index, i, bound)
                                        for i in range(0, count, SAMPLE_STRIDE)], np.float32)
    return out


def main():
    torch.set_num_threads(1)  # one summation order, so the same bytes on every machine
    torch.manual_seed(TORCH_SEED)
    net = Net()
    assert [n for n, _ in net.named_parameters()] == NAMES
    init = {name: f32(p) for name, p in net.named_parameters()}
    write_safetensors(HERE / "torch_init.safetensors", init,
                      {"format": "pt", "format_version": "1", "epoch": "0", "step": "0", "seed": str(TORCH_SEED)})

    gen = torch.Generator().manual_seed(BATCH_SEED)
    images = torch.randint(0, 256, (BATCH, 28 * 28), generator=gen, dtype=torch.uint8).numpy()
    labels = torch.randint(0, 10, (BATCH,), generator=gen).numpy().astype(np.uint8)
    x = torch.from_numpy(normalise(images)).to(torch.float64).reshape(BATCH, 1, 28, 28)
    y = torch.from_numpy(labels.astype(np.int64))

    model = Net().to(torch.float64)
    model.load_state_dict({k: torch.from_numpy(v).to(torch.float64) for k, v in init.items()})
    model.eval()  # dropout off; autograd still gives the training gradients
    out = model(x)
    loss = F.nll_loss(out, y)
    loss.backward()
    tensors = {"images": images, "labels": labels, "logprobs": out.detach().numpy().astype(np.float32),
               "loss": np.array([loss.item()], np.float64)}
    for name, p in model.named_parameters():
        tensors["grad." + name] = sampled(name, f32(p.grad))

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    for _ in range(3):
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()
    for name, p in model.named_parameters():
        tensors["step3." + name] = sampled(name, f32(p))
        tensors["momentum3." + name] = sampled(name, f32(opt.state[p]["momentum_buffer"]))
    for name in NAMES:
        tensors["torch_init." + name] = init[name].reshape(-1)[::SAMPLE_STRIDE].copy()
    tensors.update(philox_fixtures())
    tensors.update(init_fixtures(net))
    write_safetensors(HERE / "golden.safetensors", tensors,
                      {"fc1_weight_stride": str(FC1_STRIDE), "sample_stride": str(SAMPLE_STRIDE),
                       "torch_seed": str(TORCH_SEED), "init_seed": str(INIT_SEED), "lr": "0.01",
                       "momentum": "0.9", "weight_decay": "1e-4"})


if __name__ == "__main__":
    main()
