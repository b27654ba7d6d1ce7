"""The Attribution page's defaults (pure, so a benchmark can run the page's first load)."""

STEPS = (8, 16, 32, 64, 128, 256, 512)
STEPS_DEFAULT = 64
# The default examples, chosen by measuring the faithfulness table (20 random draws): on smollm2 the
# baker's ' bread' splits the methods (occlusion +0.21 over random, rollout and flow 0.26-0.28 below
# it, sd 0.11), where "The capital of France is" ties every method with random. On toy-translate
# every method ties at the translation's first word ('le' follows 'the' alone); its third word
# splits them (five ranks, differences 1.0 to -1.0).
DEFAULT_TEXT = {"decoder": "Every morning the baker opens his shop at six and sells fresh loaves of"}
DEFAULT_POSITION = {"the small dog sees the cat": 2}  # encoder-decoders: the measured position of a default text
