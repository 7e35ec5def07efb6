package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// loadResolved reads, from the audit log, the identities of the dead
// letters kscope dlt skip resolved for group (or, without --group, for the
// dead-letter topic's group), which the redrive passes over.
func (rd *redriver) loadResolved(ctx context.Context, group string) error {
	if group == "" {
		group = strings.TrimSuffix(rd.topic, ".kscope-dlt")
	}
	topic := rd.o.auditTopic
	if topic == "" {
		topic = defaultAuditTopic
	}
	var err error
	rd.resolved, err = readResolved(ctx, rd.kc, rd.adm, topic, group)
	return err
}

// passResolved reports whether r is a dead letter kscope dlt skip
// resolved: the redrive does not send it, says so on stderr, and counts
// it handled for the triage group.
func (rd *redriver) passResolved(r *kgo.Record, m retrytopic.Metadata) bool {
	audit, ok := rd.resolved[m.ID]
	if !ok {
		return false
	}
	rd.st.resolved++
	fmt.Fprintf(rd.e.stderr, "redrive: not sending partition %d offset %d (id %s): kscope dlt skip resolved it (audit record %s)\n", r.Partition, r.Offset, m.ID, audit)
	return true
}
