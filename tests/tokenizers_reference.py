"""tokenizers_reference.py: the `tokenizers` package's side of the tokenizer
tests (tests/test_tokenizer.c), run from the project root with
PYTHONPATH=build/pylib (make deps puts `tokenizers` there, from PyPI).

  train OUT.json VOCAB TEXT...    a byte-level BPE trained on the texts, as GPT-2's
  legacy IN.json OUT.json         the same file with its merges as "a b" strings
  encode TOKENIZER.json TEXT OUT  the text's ids, uint32 little-endian
  pieces TEXT OUT                 where GPT-2's pre-tokenizer ends each piece, in bytes, uint32
  prepare TOKENIZER.json TEXT DIR nanoGPT's data/shakespeare/prepare.py split:
                                  DIR/train.bin, DIR/val.bin as uint16
"""
import json
import sys
from array import array

from tokenizers import ByteLevelBPETokenizer, Tokenizer, pre_tokenizers


def write_ids(ids, path, typecode):
    a = array(typecode, ids)
    if sys.byteorder != "little":
        a.byteswap()
    with open(path, "wb") as f:
        a.tofile(f)


def main():
    cmd = sys.argv[1]
    if cmd == "train":
        out, vocab, texts = sys.argv[2], int(sys.argv[3]), sys.argv[4:]
        tok = ByteLevelBPETokenizer()
        tok.train(texts, vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
        tok.save(out)
    elif cmd == "legacy":
        with open(sys.argv[2], encoding="utf-8") as f:
            spec = json.load(f)
        spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
        with open(sys.argv[3], "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
    elif cmd == "encode":
        tok = Tokenizer.from_file(sys.argv[2])
        with open(sys.argv[3], encoding="utf-8", newline="") as f:
            text = f.read()
        write_ids(tok.encode(text).ids, sys.argv[4], "I")
    elif cmd == "pieces":
        with open(sys.argv[2], encoding="utf-8", newline="") as f:
            text = f.read()
        byte_at = [0]  # the pre-tokenizer's offsets count characters
        for ch in text:
            byte_at.append(byte_at[-1] + len(ch.encode("utf-8")))
        pieces = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)
        write_ids([byte_at[end] for _, (_, end) in pieces], sys.argv[3], "I")
    elif cmd == "prepare":
        tok = Tokenizer.from_file(sys.argv[2])
        with open(sys.argv[3], encoding="utf-8") as f:  # prepare.py's text mode: universal newlines
            data = f.read()
        n = len(data)
        train_data, val_data = data[: int(n * 0.9)], data[int(n * 0.9):]
        write_ids(tok.encode(train_data).ids, sys.argv[4] + "/train.bin", "H")
        write_ids(tok.encode(val_data).ids, sys.argv[4] + "/val.bin", "H")
    else:
        sys.exit("tokenizers_reference.py: unknown command " + cmd)


main()
