"""Writes the seed corpus: small valid GGUF and safetensors files and a few
damaged ones (python3 make_corpus.py, from fuzz/)."""
import json, struct

def s(b): return struct.pack('<Q', len(b)) + b

def kv(key, ty, payload): return s(key) + struct.pack('<I', ty) + payload

def gguf(meta, tensors, align=32, version=3):
    h = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(meta)) + b''.join(meta)
    data = b''
    for name, dims, ty, raw in tensors:
        off = len(data)
        h += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
        h += struct.pack('<IQ', ty, off)
        data += raw + b'\0' * ((-len(raw)) % align)
    h += b'\0' * ((-len(h)) % align)
    return h + data

every_type = [
    kv(b'general.architecture', 8, s(b'llama')),
    kv(b'a.u8', 0, b'\x07'), kv(b'a.i8', 1, b'\xf9'), kv(b'a.u16', 2, struct.pack('<H', 7)),
    kv(b'a.i16', 3, struct.pack('<h', -7)), kv(b'a.u32', 4, struct.pack('<I', 7)),
    kv(b'a.i32', 5, struct.pack('<i', -7)), kv(b'a.f32', 6, struct.pack('<f', 0.5)),
    kv(b'a.bool', 7, b'\x01'), kv(b'a.u64', 10, struct.pack('<Q', 7)),
    kv(b'a.i64', 11, struct.pack('<q', -7)), kv(b'a.f64', 12, struct.pack('<d', 0.5)),
    kv(b'a.strings', 9, struct.pack('<IQ', 8, 2) + s(b'x') + s(b'yz')),
    kv(b'a.ints', 9, struct.pack('<IQ', 5, 3) + struct.pack('<3i', 1, 2, 3)),
]
f32 = lambda *v: struct.pack('<%df' % len(v), *v)
tensors = [(b'w', [2, 2], 0, f32(1, 2, 3, 4)), (b'b', [2], 0, f32(5, 6))]
files = {
    'every-type.gguf': gguf(every_type, tensors),
    'aligned-64.gguf': gguf(every_type[:1] + [kv(b'general.alignment', 4, struct.pack('<I', 64))], tensors, 64),
    'alignment-0.gguf': gguf([kv(b'general.alignment', 4, struct.pack('<I', 0))], tensors),
    'no-tensors.gguf': gguf(every_type[:3], []),
    'huge-array.gguf': gguf([kv(b'a', 9, struct.pack('<IQ', 0, 1 << 40))], tensors),
    'v1.gguf': b'GGUF' + struct.pack('<III', 1, 0, 1) + struct.pack('<I', 1) + b'k' + struct.pack('<I', 4) + struct.pack('<I', 1),
}
for name, b in files.items():
    open('corpus/gguf_header/' + name, 'wb').write(b)

def st(tensors):
    header, data = {}, b''
    for name, dtype, shape, raw in tensors:
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((-len(h)) % 8)
    return struct.pack('<Q', len(h)) + h + data

sts = {
    'two.safetensors': st([('w', 'F32', [2, 2], f32(1, 2, 3, 4)), ('b', 'F16', [2], b'\0' * 4)]),
    'empty.safetensors': st([]),
    'bad-offsets.safetensors': st([('w', 'F32', [2, 2], f32(1, 2, 3, 4))])[:-4],
}
for name, b in sts.items():
    open('corpus/safetensors_header/' + name, 'wb').write(b)
