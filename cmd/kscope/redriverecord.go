package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// redriveRecord returns the record that redrives r to topic: r's key, value
// and headers minus the per-attempt routing headers, plus the audit header.
// For a null key, the partition hint is the original partition when going
// back to the source topic.
func redriveRecord(r *kgo.Record, topic string, m retrytopic.Metadata, by string, now time.Time) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	for _, h := range r.Headers {
		if routingHeaders[h.Key] || strings.HasPrefix(h.Key, springPrefix) {
			continue
		}
		hs = append(hs, h)
	}
	hs = append(hs, kgo.RecordHeader{Key: retrytopic.HeaderRedrive, Value: []byte(auditNote(by, now, r))})
	out := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs, Partition: -1}
	if topic == m.OriginalTopic {
		out.Partition = m.OriginalPartition
	}
	return out
}

// auditNote is the value of the audit header: who, when, from where.
func auditNote(by string, now time.Time, r *kgo.Record) string {
	if strings.ContainsAny(by, " \t\n\"=") {
		by = strconv.Quote(by)
	}
	return fmt.Sprintf("by=%s at=%s from=%s/%d/%d", by, now.UTC().Format(time.RFC3339), r.Topic, r.Partition, r.Offset)
}

// redrivePartitioner places a keyed record as the Java client and kgo's
// default do (murmur2 of the key), so a key lands where its earlier records
// are; a record without a key goes to the partition in its Partition field
// when the topic has it (its original partition), else to any.
func redrivePartitioner() kgo.Partitioner {
	keyed := kgo.StickyKeyPartitioner(nil)
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		byKey := keyed.ForTopic(topic)
		return func(r *kgo.Record, n int) int {
			if r.Key != nil {
				return byKey.Partition(r, n)
			}
			if r.Partition >= 0 && int(r.Partition) < n {
				return int(r.Partition)
			}
			return rand.IntN(n)
		}
	})
}
