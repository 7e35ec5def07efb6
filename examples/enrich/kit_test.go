package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/kscopetest"
	"github.com/kscope-dev/kscope/txn"
)

// The enrich pipeline passes kscope's Kafka-scope test kit.
func TestEnrichDeliverySemantics(t *testing.T) {
	rep := kscopetest.Kafka(t, kscopetest.KafkaPipeline{
		Handler:         txn.HandlerFunc(Enrich),
		OutputTopics:    []string{enrichedTopic},
		OutputsPerInput: 1,
		Valid: func(i int) *kgo.Record {
			body, _ := json.Marshal(Order{ID: fmt.Sprintf("o-%d", i), Customer: "c", Cents: int64(i * 1000)})
			return &kgo.Record{Value: body}
		},
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("<order/>")} },
	})
	for _, r := range rep {
		t.Logf("%-30s held=%v %s", r.Scenario, r.Held, r.Detail)
	}
}
