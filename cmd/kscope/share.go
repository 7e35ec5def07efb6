package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// shareDescribeUsage is share describe's synopsis, description and
// examples.
const shareDescribeUsage = `
Usage:
  kscope share describe --group G [--json]

Shows a share group's state (consumer.Config.Share runs a runner as one
of its members): its members (member id, client id, host and the
partitions assigned to each: in a share group several members share a
partition), and per partition the group consumes the share-partition
start offset (below it every record is acknowledged, or archived by
'kscope share reset'), the end offset of the log, the broker's lag (its
count of the records not yet acknowledged, which Kafka 4.1 and later
report) and the backlog: the records not yet acknowledged by the group,
those in flight included. The backlog is the lag where the broker
reports it, else the end offset minus the start offset (Apache Kafka
moves the start offset it reports lazily, past acknowledged records
only now and then: the lag is exact).

The broker does not report which records are in flight nor their
delivery counts: no admin request of Kafka returns them (a member's
runner counts them: consumer.Stats().Share, and the kscope_share_*
metrics of package kscopeprom; a dead letter past MaxDeliveries carries
the header kscope-delivery-count).

Examples:
  kscope share describe --group payments-workers
  kscope share describe --group payments-workers --json
`

func shareDescribeCmd() *command {
	return &command{
		name:    "share describe",
		summary: "show a share group's members, start offsets and backlog per partition",
		usage:   shareDescribeUsage,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			brokers := brokerFlag(fs)
			group := fs.String("group", "", "the share group (required)")
			asJSON := fs.Bool("json", false, "print the description as one JSON object")
			to := timeoutFlags(fs)
			return func(ctx context.Context) error {
				if *group == "" {
					return usagef("give the share group with --group")
				}
				kc, cl, adm, err := e.kafkaAdmin(*brokers, to)
				if err != nil {
					return err
				}
				defer cl.Close()
				d, err := describeShare(ctx, kc, adm, *group)
				if err != nil {
					return err
				}
				if *asJSON {
					return json.NewEncoder(e.stdout).Encode(d)
				}
				d.print(e.stdout)
				return nil
			}
		},
	}
}

// notReported says what the broker does not report of a share group.
const notReported = "in flight and delivery counts: not reported by the broker (no admin request of Kafka returns them); " +
	"a member's runner counts them (consumer.Stats().Share, kscopeprom's kscope_share_* metrics)"

// shareDescription is what share describe prints (and --json encodes).
type shareDescription struct {
	Group      string           `json:"group"`
	State      string           `json:"state"`
	Members    []shareMember    `json:"members"`
	Partitions []sharePartition `json:"partitions"`
	Backlog    int64            `json:"backlog"`
	Note       string           `json:"not_reported"`
}

// shareMember is one member of a share group.
type shareMember struct {
	MemberID string   `json:"member_id"`
	ClientID string   `json:"client_id"`
	Host     string   `json:"host"`
	Assigned []string `json:"assigned"` // topic[partition]
}

// sharePartition is one partition a share group consumes.
type sharePartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Start is the share-partition start offset: -1 when the group has
	// not started the partition.
	Start int64 `json:"start_offset"`
	End   int64 `json:"end_offset"`
	// Backlog is the records not yet acknowledged: Lag when the broker
	// reports it, else End minus Start.
	Backlog int64 `json:"backlog"`
	// Lag is the broker's count of the records not yet acknowledged;
	// -1 when it does not report it.
	Lag   int64  `json:"lag"`
	Error string `json:"error,omitempty"`
}

// describeShare reads group's members, its share-partition start offsets
// and the end offsets of their partitions.
func describeShare(ctx context.Context, kc *kafkaConn, adm *kadm.Client, group string) (*shareDescription, error) {
	d := &shareDescription{Group: group, Members: []shareMember{}, Partitions: []sharePartition{}, Note: notReported}
	if err := kc.do(ctx, retrying(func(ctx context.Context) error { return d.readGroup(ctx, adm) })); err != nil {
		return nil, err
	}
	var offs kadm.DescribedShareGroupsOffsets
	err := kc.do(ctx, retrying(func(ctx context.Context) (err error) {
		offs, err = adm.DescribeShareGroupOffsets(ctx, group)
		if err == nil {
			err = offs[group].Err
		}
		return err
	}))
	if err != nil {
		return nil, fmt.Errorf("describing the start offsets of share group %q: %w", group, err)
	}
	starts := offs[group].Offsets
	var ends kadm.ListedOffsets
	if topics := startTopics(starts); len(topics) > 0 {
		err = kc.do(ctx, func(ctx context.Context) (err error) { ends, err = adm.ListEndOffsets(ctx, topics...); return err })
		if err != nil {
			return nil, fmt.Errorf("listing the end offsets of %s: %w", strings.Join(topics, ", "), err)
		}
	}
	for _, so := range starts.Sorted() {
		p := sharePartition{Topic: so.Topic, Partition: so.Partition, Start: so.StartOffset, End: -1, Lag: so.Lag}
		if so.Err != nil {
			p.Error = so.Err.Error()
		}
		if end, ok := ends.Lookup(so.Topic, so.Partition); ok && end.Err == nil {
			p.End = end.Offset
		} else if ok && p.Error == "" {
			p.Error = "end offset: " + end.Err.Error()
		}
		p.Backlog = shareBacklog(so, p.End)
		d.Backlog += p.Backlog
		d.Partitions = append(d.Partitions, p)
	}
	return d, nil
}

// readGroup reads the group's state and members; a group that does not
// exist is an error that says so.
func (d *shareDescription) readGroup(ctx context.Context, adm *kadm.Client) error {
	gs, err := adm.DescribeShareGroups(ctx, d.Group)
	if err != nil {
		return fmt.Errorf("describing share group %q: %w", d.Group, err)
	}
	g, ok := gs[d.Group]
	if !ok || errors.Is(g.Err, kerr.GroupIDNotFound) || errors.Is(g.Err, kerr.InconsistentGroupProtocol) || g.GroupState == "Dead" {
		// Kafka answers so for a consumer group too: say which it is.
		if state, _, err := describeGroup(ctx, adm, d.Group); err == nil && state != "" {
			return fmt.Errorf("group %q is a consumer group (state %s), not a share group: 'kscope replay' moves its offsets", d.Group, state)
		}
		return fmt.Errorf("share group %q does not exist (no member ever joined it): check --group", d.Group)
	}
	if g.Err != nil {
		return fmt.Errorf("describing share group %q: %w", d.Group, g.Err)
	}
	d.State = g.GroupState
	for _, m := range g.Members {
		sm := shareMember{MemberID: m.MemberID, ClientID: m.ClientID, Host: strings.TrimPrefix(m.ClientHost, "/"), Assigned: []string{}}
		for _, tp := range m.Assignment.Sorted() {
			for _, p := range tp.Partitions {
				sm.Assigned = append(sm.Assigned, fmt.Sprintf("%s[%d]", tp.Topic, p))
			}
		}
		d.Members = append(d.Members, sm)
	}
	return nil
}

// startTopics returns the topics of starts, sorted.
func startTopics(starts kadm.ShareOffsets) []string {
	var ts []string
	for t := range starts {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// print writes the description as tables.
func (d *shareDescription) print(w io.Writer) {
	fmt.Fprintf(w, "share group %s: state %s, %s\n", d.Group, d.State, plural(len(d.Members), "member"))
	if len(d.Members) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER ID\tCLIENT ID\tHOST\tASSIGNED")
		for _, m := range d.Members {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.MemberID, m.ClientID, m.Host, dash(strings.Join(m.Assigned, " ")))
		}
		tw.Flush()
	}
	if len(d.Partitions) == 0 {
		fmt.Fprintln(w, "no start offsets: the group has not consumed a partition yet")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPARTITION\tSTART OFFSET\tEND OFFSET\tBACKLOG\tLAG")
		for _, p := range d.Partitions {
			start, backlog, lag := fmt.Sprint(p.Start), fmt.Sprint(p.Backlog), "not reported"
			if p.Start < 0 {
				start = "none"
			}
			if p.Lag >= 0 {
				lag = fmt.Sprint(p.Lag)
			}
			if p.Error != "" {
				lag += " (" + p.Error + ")"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", p.Topic, p.Partition, start, p.End, backlog, lag)
		}
		tw.Flush()
		fmt.Fprintf(w, "backlog: %s not yet acknowledged, in flight included (the broker's lag where it reports one, else end offset minus start offset)\n", plural64(d.Backlog, "record"))
	}
	fmt.Fprintln(w, notReported)
}

// shareBacklog returns the records of a partition a share group has not
// acknowledged yet: the broker's lag when it reports one, else the end
// offset minus the share-partition start offset (0 for a partition the
// group has not started, or whose end is unknown).
func shareBacklog(so kadm.ShareOffset, end int64) int64 {
	switch {
	case so.Lag >= 0:
		return so.Lag
	case so.StartOffset >= 0 && end >= so.StartOffset:
		return end - so.StartOffset
	}
	return 0
}

// retrying calls fn again, every 100ms, while it fails with an error
// Kafka says is retriable (a group coordinator that moves or loads) and
// ctx is not done: kadm returns a group's errors without retrying them.
func retrying(fn func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		for {
			err := fn(ctx)
			if err == nil || !kerr.IsRetriable(err) {
				return err
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}
