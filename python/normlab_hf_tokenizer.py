"""A Hugging Face tokenizer that is exactly a normlab run's SentencePiece model (an optional helper).

`normlab export RUN --to DIR --format hf` writes DIR/tokenizer.model, the SentencePiece model the run
was trained with. normlab encodes text with SentencePiece itself (its normalization: NFKC, whitespace
runs collapsed, newlines and tabs as spaces, no leading space kept); this class does the same through
the `sentencepiece` package, so that Hugging Face tools (lm-evaluation-harness's HFLM, pipelines)
see the token ids normlab saw:

    import transformers, normlab_hf_tokenizer
    tok = normlab_hf_tokenizer.from_export("DIR")
    model = transformers.LlamaForCausalLM.from_pretrained("DIR", dtype=torch.float32)

The export itself needs no code: its tokenizer_config.json names transformers' own
SentencePieceBackend (transformers 5), so `transformers.AutoTokenizer.from_pretrained("DIR")` gives
the same ids without this module and without remote code. The export holds no copy of this file;
import it from normlab's python/ (or PREFIX/share/normlab/python) for transformers 4, or to decode
exactly as SentencePiece does (SentencePieceBackend's decode joins pieces: byte pieces stay <0x..>).

What it does, against a converted Llama tokenizer (transformers' LlamaTokenizer(Fast)):
- `encode(text)` is `SentencePieceProcessor.encode(text)` on the whole text: text that spells a
  special token ("</s>", "<unk>") is encoded as characters, as normlab does, never mapped to the
  special id.
- No special token is ever added (no BOS: normlab's language models are trained on lines separated
  by EOS, without BOS). `add_special_tokens` changes nothing.
- The special tokens are the model's own ids (normlab: pad 0, unk 1, eos 3). `bos_token` is unset
  by default, so a tool that puts "BOS, else EOS" before an empty context (the harness's HFLM
  `prefix_token_id`) puts EOS, as `normlab eval --tasks` does; pass bos_token="<s>" to set it.

Needs `transformers` (4.x or 5.x) and `sentencepiece`.
"""
import os
import shutil

import sentencepiece
import transformers

__all__ = ["NormlabSentencePieceTokenizer", "from_export"]


class NormlabSentencePieceTokenizer(transformers.PreTrainedTokenizer):
    """A SentencePiece model as a (slow, Python) Hugging Face tokenizer: ids exactly
    `SentencePieceProcessor(model_file=vocab_file).encode(text)`."""

    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, bos_token=None, **kwargs):
        self.vocab_file = vocab_file
        self.sp_model = sentencepiece.SentencePieceProcessor(model_file=vocab_file)

        def piece(i):  # -1: the model has no such token
            return self.sp_model.id_to_piece(i) if 0 <= i < self.sp_model.get_piece_size() else None

        kwargs.setdefault("eos_token", piece(self.sp_model.eos_id()))
        kwargs.setdefault("unk_token", piece(self.sp_model.unk_id()))
        kwargs.setdefault("pad_token", piece(self.sp_model.pad_id()))
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("split_special_tokens", True)
        kwargs.setdefault("padding_side", "right")
        super().__init__(bos_token=bos_token, **kwargs)

    # --- the vocabulary: the model's pieces, ids as in the model -------------------------------
    @property
    def vocab_size(self):
        return self.sp_model.get_piece_size()

    def __len__(self):
        return self.sp_model.get_piece_size()

    def get_vocab(self):
        return {self.sp_model.id_to_piece(i): i for i in range(self.sp_model.get_piece_size())}

    # --- encoding: SentencePiece on the whole text, nothing split off or added ------------------
    def tokenize(self, text, **kwargs):
        """The model's pieces for `text` (special-token spellings included, as plain text)."""
        return self.sp_model.encode(text, out_type=str)

    def _tokenize(self, text, **kwargs):
        return self.sp_model.encode(text, out_type=str)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self.sp_model.piece_to_id(tokens)
        return [self.sp_model.piece_to_id(t) for t in tokens]

    def _convert_token_to_id(self, token):
        return self.sp_model.piece_to_id(token)

    def _convert_id_to_token(self, index):
        return self.sp_model.id_to_piece(index)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        return list(token_ids_0) + (list(token_ids_1) if token_ids_1 is not None else [])

    def num_special_tokens_to_add(self, pair=False):
        return 0

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        return [0] * (len(token_ids_0) + (len(token_ids_1) if token_ids_1 is not None else 0))

    def create_token_type_ids_from_sequences(self, token_ids_0, token_ids_1=None):
        return [0] * (len(token_ids_0) + (len(token_ids_1) if token_ids_1 is not None else 0))

    # --- decoding: SentencePiece's ------------------------------------------------------------
    def convert_tokens_to_string(self, tokens):
        return self.sp_model.decode_pieces(list(tokens))

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs):
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        return self.sp_model.decode(ids)

    # --- saving: the model file itself ----------------------------------------------------------
    def save_vocabulary(self, save_directory, filename_prefix=None):
        out = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tokenizer.model")
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)


def from_export(export_dir, **kwargs):
    """The tokenizer of `normlab export --format hf` (or torch) folder: its tokenizer.model."""
    path = os.path.join(export_dir, "tokenizer.model")
    if not os.path.isfile(path):
        raise FileNotFoundError("%s: no tokenizer.model (a run on token shards that record no "
                                "tokenizer exports none: nanoGPT, NumPy, Megatron)" % export_dir)
    return NormlabSentencePieceTokenizer(path, **kwargs)
