package txn

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// Start's check, without Options.Versions, that no record waits parked in
// a version changelog.

// parkedLookupTimeout bounds checkNoParked's lookup of the changelogs.
const parkedLookupTimeout = 5 * time.Second

// checkNoParked is Start's check for a runner without Options.Versions:
// a record that a deployment with Versions parked in a version changelog
// behind a gap has its input offset committed, and only a runner with
// Versions applies it (when the gap fills) or dead-letters it (after
// GapTimeout). While one waits, it returns a *consumer.ConfigError on
// Versions that says how many wait and what to do. Otherwise it returns
// the changelogs it read (none when Versions was never set). A changelog
// that cannot be read is reported by the error, which Start logs.
func checkNoParked(ctx context.Context, cfg consumer.Config) (ce *consumer.ConfigError, changelogs []string, err error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, cfg.ClientOptions...), kgo.SeedBrokers(cfg.Brokers...))...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	names := make([]string, 0, len(cfg.Topics))
	for _, t := range cfg.Topics {
		names = append(names, VersionsTopic(cfg.Group, t))
	}
	// Bounded: a broker that refuses the client's setup is reported by
	// the runner's own first lookup (consumer.ErrBrokerSetup).
	lctx, cancel := context.WithTimeout(ctx, parkedLookupTimeout)
	td, err := kadm.NewClient(cl).ListTopics(lctx, names...)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	var parts []tp
	for _, t := range cfg.Topics {
		if d, ok := td[VersionsTopic(cfg.Group, t)]; ok && d.Err == nil {
			for p := range d.Partitions {
				parts = append(parts, tp{t, p})
			}
		}
	}
	if len(parts) == 0 {
		return nil, nil, nil // no changelog: Versions was never set
	}
	state, err := readState(ctx, cfg, cfg.Group, parts)
	if err != nil {
		return nil, nil, err
	}
	count := map[string]int{}
	var oldest time.Time
	for k, pv := range state {
		for _, m := range pv.parked {
			for _, p := range m {
				count[k.topic]++
				if oldest.IsZero() || p.Since.Before(oldest) {
					oldest = p.Since
				}
			}
		}
	}
	if len(count) == 0 {
		seen := map[string]bool{}
		for _, k := range parts {
			if vt := VersionsTopic(cfg.Group, k.topic); !seen[vt] {
				seen[vt] = true
				changelogs = append(changelogs, vt)
			}
		}
		return nil, changelogs, nil
	}
	var where []string
	for _, t := range cfg.Topics {
		if n := count[t]; n > 0 {
			where = append(where, fmt.Sprintf("%d in %s", n, VersionsTopic(cfg.Group, t)))
		}
	}
	return &consumer.ConfigError{Struct: "txn.Options", Field: "Versions", Reason: fmt.Sprintf(
		"is nil, but records that a deployment with Versions parked behind a version gap wait in its changelog (%s; the oldest since %s), "+
			"their input offsets committed: without Versions they are neither applied nor dead-lettered. Run with Versions as before until "+
			"none waits (a short GapTimeout sends them to the dead-letter topic), or delete the changelog topic to drop them",
		strings.Join(where, ", "), oldest.Format(time.RFC3339))}, nil, nil
}
