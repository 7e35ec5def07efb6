package main

// scale_members: one consumer group of 1, 2, 4 and 6 member processes on a
// 3-node Apache Kafka cluster, the throughput and the members' CPU per
// record.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/kscope-dev/kscope/internal/testenv"
)

const (
	// scalePartitions is the partitions of scale_members' topic, as in
	// the rolling-deploy rows of make reliability.
	scalePartitions = 48
	// scaleNodes is the size of its Apache Kafka cluster.
	scaleNodes = 3
)

// scaleKey is scale_members' ratio: the CPU per record with the most
// members over that with one.
const scaleKey = "scale_cpu_6_vs_1"

// scaleMembers are the group sizes scale_members measures.
var scaleMembers = []int{1, 2, 4, 6}

// scalePoint is one group size's medians.
type scalePoint struct {
	members   int
	rate      float64 // records per second, in the window
	cpuPerRec float64 // the members' CPU per record in the window, µs
}

// scale measures scale_members on a 3-node Apache Kafka cluster of its
// own: for each group size, runs rounds of a new group reading n records
// with a no-op handler; the window opens at a fifth of them, once the
// members have joined. The ratio reported is the CPU per record with 6
// members over that with 1.
func (b *bench) scale(ctx context.Context, rep *report, n, runs int) error {
	b.logf("scale_members: starting a %d-node Apache Kafka %s cluster", scaleNodes, testenv.ApacheKafkaVersion)
	k, err := testenv.StartApacheKafka(ctx, testenv.ApacheOptions{Nodes: scaleNodes})
	if err != nil {
		return fmt.Errorf("starting Apache Kafka: %w", err)
	}
	defer k.Close()
	sb := &bench{k: k, runs: runs, log: b.log, out: b.out, topic: "bench.scale"}
	if err := k.CreateTopic(ctx, sb.topic, scalePartitions); err != nil {
		return fmt.Errorf("creating %s: %w", sb.topic, err)
	}
	b.logf("scale_members: producing %d records to %d partitions", n, scalePartitions)
	if err := sb.produceTo(ctx, sb.topic, n); err != nil {
		return err
	}
	for _, m := range scaleMembers {
		var rates, cpus []float64
		for r := range runs {
			rps, cpu, err := sb.scaleRound(ctx, m, n)
			if err != nil {
				return fmt.Errorf("scale_members, %d members: %w", m, err)
			}
			b.logf("scale_members: %d members, round %d: %s records/s, %.2f µs CPU/record", m, r+1, rate(rps), cpu)
			rates, cpus = append(rates, rps), append(cpus, cpu)
		}
		rep.scale = append(rep.scale, scalePoint{members: m, rate: median(rates), cpuPerRec: median(cpus)})
	}
	first, last := rep.scale[0], rep.scale[len(rep.scale)-1]
	rep.add(scenario{key: scaleKey, title: "scale_members: 1, 2, 4 and 6 members of one group (3-node Apache Kafka)",
		ratio: last.cpuPerRec / first.cpuPerRec, noTarget: true})
	return nil
}

// scaleRound runs members member processes of a new group until they have
// handled n records, and returns the rate and the CPU per record (µs) of
// the window.
func (b *bench) scaleRound(ctx context.Context, members, n int) (rps, cpuPerRec float64, err error) {
	t := newTally(members, int64(n), int64(n/5))
	env := append(os.Environ(), roleEnv+"="+roleMember, "KAFKA_BROKERS="+strings.Join(b.k.Brokers, ","),
		groupEnv+"="+b.name("scale"), topicEnv+"="+b.topic, memberNoop+"=1", memberShare+"=0")
	end, err := runMembers(ctx, env, t)
	if err != nil {
		return 0, 0, err
	}
	recs, cpu := t.window()
	t.mu.Lock()
	elapsed := end.Sub(t.opened)
	t.mu.Unlock()
	if recs <= 0 || elapsed <= 0 {
		return 0, 0, errors.New("the window saw no records")
	}
	return float64(recs) / elapsed.Seconds(), float64(cpu.Microseconds()) / float64(recs), nil
}

// writeScale writes scale_members' section: its table and ratio.
func (r *report) writeScale(b *strings.Builder, s scenario) {
	fmt.Fprintf(b, "One consumer group of member processes (the AtLeastOnce runner, a no-op handler, default shards) on a %d-node "+
		"Apache Kafka cluster, a topic of %d partitions (replication factor 3) holding %s records; each round is a new group reading "+
		"them all. The window opens once a fifth of them are handled, after the members joined. This machine has 2 cores, shared "+
		"with the 3 brokers: records per second cannot grow with members, and the figure to watch is the members' CPU per record "+
		"(their user and system time in the window over its records), which should stay flat. Medians of %d rounds.\n\n",
		scaleNodes, scalePartitions, group(int64(r.plan.scale)), r.runs)
	b.WriteString("| members | records/s | members' CPU µs/record | CPU per record against 1 member |\n| ---: | ---: | ---: | ---: |\n")
	for _, pt := range r.scale {
		fmt.Fprintf(b, "| %d | %s | %.2f | %.2f |\n", pt.members, rate(pt.rate), pt.cpuPerRec, pt.cpuPerRec/r.scale[0].cpuPerRec)
	}
	fmt.Fprintf(b, "\n`%s` = %.3g: reported, with no target yet.\n", s.key, s.ratio)
}
