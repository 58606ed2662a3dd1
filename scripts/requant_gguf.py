#!/usr/bin/env python3
"""Writes a GGUF file again with its quantized weight matrices in another llama.cpp type.

    .venv/bin/python scripts/requant_gguf.py IN.gguf OUT.gguf Q4_0|Q8_0|Q4_1|Q5_0|Q5_1

Every matrix stored in a 32-wide block type other than the token embedding is dequantized and
quantized again as the given type by gguf-py (ggml's own Python package, the code llama.cpp's
converter quantizes with); the embedding, norms and every metadata key are copied as stored.
scripts/bench.sh makes SmolLM2's Q4_0 and Q8_0 files from its Q4_1 file with it, so each of
llama.cpp's block layouts is measured on real weights. Needs `pip install gguf` (bench.sh does it).
"""
import sys

import gguf
from gguf import GGMLQuantizationType as Q

BLOCK_TYPES = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}
FILE_TYPE = {"Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
             "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
             "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def main():
    src, dst, kind = sys.argv[1:4]
    target = Q[kind]
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself.
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        if field.name == "general.file_type":
            writer.add_file_type(FILE_TYPE[kind])
            continue
        kind_of = field.types[0]
        sub = field.types[-1] if kind_of == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind_of, sub_type=sub)
    for t in reader.tensors:
        if t.tensor_type in BLOCK_TYPES and t.name != "token_embd.weight":
            data = gguf.quants.quantize(gguf.quants.dequantize(t.data, t.tensor_type), target)
            writer.add_tensor(t.name, data, raw_dtype=target)
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
