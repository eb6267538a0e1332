// batches: the rows the data loader (dataloader.h) packs for one rank, for the tests of its data order against
// nanochat's (dev/data/test_data_order.py). make dev/data/bin/batches
//
//   dev/data/bin/batches PATTERN VOCAB BOS B T RANK RANKS BATCHES [RESUME_AT]
//
// Prints, per batch, its B rows of T + 1 tokens (inputs and the last target), one row per line, ids separated by
// spaces. RESUME_AT k: after k batches the loader's state is saved, a new loader is restored from it and packs the
// rest (the output must be the same as without). Any bad input: one "error: ..." line, exit code 1.
#include "dataloader.h"

int main(int argc, char** argv) {
    if (argc != 9 && argc != 10) {
        fprintf(stderr, "usage: %s PATTERN VOCAB BOS B T RANK RANKS BATCHES [RESUME_AT]\n", argv[0]);
        return 1;
    }
    const int vocab = parse_int32("VOCAB", argv[2]), bos = parse_int32("BOS", argv[3]), B = parse_int32("B", argv[4]),
              T = parse_int32("T", argv[5]), rank = parse_int32("RANK", argv[6]), ranks = parse_int32("RANKS", argv[7]),
              batches = parse_int32("BATCHES", argv[8]), resume_at = argc == 10 ? parse_int32("RESUME_AT", argv[9]) : -1;
    if (vocab < 1 || bos < 0 || bos >= vocab || B < 1 || T < 1 || ranks < 1 || rank < 0 || rank >= ranks || batches < 0)
        fail("VOCAB, B, T and RANKS must be >= 1, BOS in [0, VOCAB), RANK in [0, RANKS), BATCHES >= 0");
    DataLoader dl;
    dataloader_init(&dl, argv[1], "shard", vocab, bos, B, T, rank, ranks);
    for (int b = 0; b < batches; b++) {
        if (b == resume_at) {
            const std::vector<int64_t> state = dataloader_state(&dl);
            dataloader_free(&dl);
            dataloader_init(&dl, argv[1], "shard", vocab, bos, B, T, rank, ranks);
            dataloader_restore(&dl, state, "the saved state");
        }
        dataloader_next_batch(&dl);
        for (int r = 0; r < B; r++) {
            for (int t = 0; t < T; t++) printf("%d ", dl.inputs[(size_t)r * T + t]);
            printf("%d\n", dl.targets[(size_t)r * T + T - 1]);
        }
    }
    dataloader_free(&dl);
    return 0;
}
