package txn

import (
	"log/slog"
	"slices"

	"github.com/kscope-dev/kscope/consumer"
)

// pointTopics returns the topics of a transaction's points, each once and
// sorted: the topics whose offsets it committed (hook.Commit.Topics).
func pointTopics(points map[tp]txnPoint) []string {
	var out []string
	for k := range points {
		if !slices.Contains(out, k.topic) {
			out = append(out, k.topic)
		}
	}
	slices.Sort(out)
	return out
}

// recordAttrs are the structured fields of a log line about rec: its
// coordinates and its identity ("id": the kscope-id header, else the
// message-id header, else what consumer.Config.Identity derives), so that
// one message can be followed across services by its id.
func (s *kafkaScope) recordAttrs(rec *consumer.Record) []slog.Attr {
	return []slog.Attr{slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)), slog.Int64("offset", rec.Offset),
		slog.String("id", s.cfg.Identity.Of(rec))}
}
