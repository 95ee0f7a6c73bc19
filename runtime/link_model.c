/* link_model.c: a collective's cost on the modeled link (link_model.h). */
#include "link_model.h"

double ring_seconds(LinkModel link, int nranks, int all_reduce, size_t n, DType dtype) {
    if (link.gbps <= 0 || nranks == 1) return 0.0;
    double N = nranks, bytes = (double)n * (double)number_bytes(dtype);
    double volume = (all_reduce ? 2.0 : 1.0) * (N - 1) / N * bytes;
    return (N - 1) * link.latency_us * 1e-6 + volume / (link.gbps * 1e9);
}

LinkCost link_cost_add(LinkCost a, LinkCost b) {
    return (LinkCost){ a.seconds + b.seconds, a.inter_bytes + b.inter_bytes };
}

/* Whether `span` consecutive ranks lie on more than one node of a two-tier link. */
static int spans_nodes(const LinkShape *l, int span) {
    return l->inter.gbps > 0 && l->node_ranks > 0 && span > l->node_ranks;
}

static LinkModel tier(const LinkShape *l, int span) { return spans_nodes(l, span) ? l->inter : l->intra; }

/* A ring over `span` consecutive ranks, on its tier; between nodes, one hop
 * a node it spans (the ring closes), each carrying f (M-1)/M of the bytes. */
static LinkCost ring(const LinkShape *l, int span, int all_reduce, size_t n, DType dtype) {
    LinkCost c = { ring_seconds(tier(l, span), span, all_reduce, n, dtype), 0.0 };
    if (spans_nodes(l, span)) {
        double M = span, crossings = (double)span / l->node_ranks;
        c.inter_bytes = crossings * (all_reduce ? 2.0 : 1.0) * (M - 1) / M * (double)n * (double)number_bytes(dtype);
    }
    return c;
}

/* The ordered chain between the G groups (link_model.h): two legs, each
 * (G-1) latency + a rank's shard / bandwidth; each leg crosses every node
 * boundary on its way once, a group's ranks sending n numbers there. */
static LinkCost chain(const LinkShape *l, size_t n, DType dtype) {
    int G = l->world / l->shards;
    LinkModel t = tier(l, l->world);
    if (G == 1 || t.gbps <= 0) return (LinkCost){ 0.0, 0.0 };
    double shard_bytes = (double)n / l->shards * (double)number_bytes(dtype);
    double leg = (G - 1) * t.latency_us * 1e-6 + shard_bytes / (t.gbps * 1e9);
    LinkCost c = { 2.0 * leg, 0.0 };
    if (spans_nodes(l, l->world)) {
        int crossings = l->shards >= l->node_ranks ? G - 1 : l->world / l->node_ranks - 1;
        c.inter_bytes = 2.0 * crossings * (double)n * (double)number_bytes(dtype);
    }
    return c;
}

LinkCost link_cost(const LinkShape *l, LinkCollective what, size_t n, DType dtype) {
    if (l->intra.gbps <= 0 || l->world == 1) return (LinkCost){ 0.0, 0.0 };
    LinkCost gather = ring(l, l->shards, 0, n, dtype);
    LinkCost scatter = link_cost_add(ring(l, l->shards, 0, n, dtype), chain(l, n, dtype));
    if (what == LINK_ALL_GATHER) return gather;
    if (what == LINK_REDUCE_SCATTER) return scatter;
    /* an all-reduce: a ring's over every rank; over groups, the two halves it is made of */
    return l->shards == l->world ? ring(l, l->world, 1, n, dtype) : link_cost_add(scatter, gather);
}
