/* link_model.h: the modeled link between simulated ranks (--link, --link-inter):
 * what a collective costs on it, in seconds and in bytes between nodes.
 *
 * Why: simulated ranks share one device, so their collectives cost nothing
 * and overlap would have nothing to hide. A modeled link gives each collective
 * the time a real one would take (the process group holds the ranks'
 * communication streams that long, runtime/process_group.h), and the strategy
 * registry's cost models (strategies/strategy.h) sum the same costs over a step.
 *
 * The link has one tier (--link, inside a node) or two (--link-inter between
 * nodes of node_ranks consecutive ranks). A ring over M ranks takes
 * (M-1) latency + f (M-1)/M bytes / bandwidth, f = 2 for an all-reduce and 1
 * for a reduce-scatter or an all-gather, on the slower tier where it spans
 * nodes (each of its steps waits for its slowest hop). A number is 4 bytes, or
 * 2 in a reduction in bf16 (--reduce-dtype).
 *
 * Under hybrid sharding (S shards over G = N / S groups, S dividing N) a
 * reduce-scatter is the group's ring reduce-scatter, then an ordered chain
 * between the groups: group g adds its ranks to group g - 1's partial sum of
 * each shard (n / S numbers a rank), in order, and passes it on; the last
 * group's sums go back along the chain. Pipelined in chunks, each leg takes
 * (G-1) latency + (n / S) bytes / bandwidth, against a ring all-reduce's
 * 2 (G-1) latency + 2 (G-1)/G (n / S) bytes / bandwidth: the same at many
 * groups, twice the bandwidth term at two; the price of keeping every sum in
 * rank order 0..N-1. An all-gather stays inside the group.
 */
#ifndef ZF_LINK_MODEL_H
#define ZF_LINK_MODEL_H

#include <stddef.h>

#include "bf16.h"

/* A link between ranks as a ring uses it: its bandwidth in GB/s and each
 * hop's latency (--link). gbps = 0: no modeled link. */
typedef struct { double gbps, latency_us; } LinkModel;

/* The ranks and the link a collective runs over: `world` ranks in `shards`
 * shards (world: full sharding; fewer: groups of `shards` ranks), and a link of
 * one tier (inter.gbps 0) or two, nodes of node_ranks consecutive ranks apart
 * (node_ranks dividing world, and dividing shards or a multiple of them). */
typedef struct {
    LinkModel intra, inter;
    int world, shards, node_ranks;
} LinkShape;

typedef enum { LINK_ALL_REDUCE, LINK_REDUCE_SCATTER, LINK_ALL_GATHER } LinkCollective;

/* What a collective costs: the seconds it holds the link, and the bytes it
 * moves between nodes, every rank's together (0 on one tier). */
typedef struct {
    double seconds, inter_bytes;
} LinkCost;

/* A ring over nranks ranks on one link, for n numbers of that precision. */
double ring_seconds(LinkModel link, int nranks, int all_reduce, size_t n, DType dtype);
/* A collective of n numbers of that precision on the shape's link. */
LinkCost link_cost(const LinkShape *shape, LinkCollective what, size_t n, DType dtype);
/* a + b, a cost of two collectives after each other. */
LinkCost link_cost_add(LinkCost a, LinkCost b);

#endif
