"""The neural-network pieces of the objectives (decoders, losses, the vocabulary pooling); importing the
package imports none of them (``vocab_pool`` is pure torch: DupMAE's retrieval head uses it without fairseq)."""
