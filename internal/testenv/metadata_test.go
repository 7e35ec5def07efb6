package testenv

import (
	"context"
	"testing"
)

// WaitTopic reads the broker's metadata, not the admin client's cache: a
// topic the client looked up before it existed is seen at the first
// request after its creation (kadm's cached Metadata would keep answering
// "unknown topic" for MetadataMinAge, 5 s).
func TestTopicMetadataIsNotTheClientsCache(t *testing.T) {
	ctx := context.Background()
	k := KafkaT(t)
	if _, err := k.Admin().Metadata(ctx, "late"); err != nil { // caches the topic as unknown
		t.Fatal(err)
	}
	resp, err := k.Admin().CreateTopic(ctx, 2, -1, nil, "late")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	if k.Cluster != nil { // kfake: the topic has its leaders at once
		td, err := topicMetadata(ctx, k.admin(), "late")
		if err != nil || len(td.Partitions) != 2 {
			t.Fatalf("the first metadata request after the creation: %d partitions, %v; want 2 and no error", len(td.Partitions), err)
		}
	}
	if err := k.WaitTopic(ctx, "late", 2); err != nil {
		t.Fatal(err)
	}
}
