package partition

import "fmt"

// NullKeyPolicy says how records without a key are routed to shards.
type NullKeyPolicy int

const (
	// NullKeyOrdered routes every null-key record of a partition to one
	// shard, so null-key records keep their partition order. This is the
	// default.
	NullKeyOrdered NullKeyPolicy = iota
	// NullKeySpread spreads null-key records over all shards by offset:
	// more parallelism, no ordering between them.
	NullKeySpread
)

// String returns the policy's name.
func (p NullKeyPolicy) String() string {
	switch p {
	case NullKeyOrdered:
		return "NullKeyOrdered"
	case NullKeySpread:
		return "NullKeySpread"
	}
	return fmt.Sprintf("NullKeyPolicy(%d)", int(p))
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// Shard returns the shard, in [0, shards), of a record with the given topic,
// partition, offset and key. The same topic and key always give the same
// shard, whatever the partition (a key that moves partitions after a
// repartition stays on one worker). shards must be positive.
func Shard(topic string, partition int32, offset int64, key []byte, shards int, nullKeys NullKeyPolicy) int {
	return HashTopic(topic).Shard(partition, offset, key, shards, nullKeys)
}

// TopicHash is the part of a record's shard hash that depends on its topic
// alone: computed once, it routes every record of a poll of that topic.
type TopicHash uint64

// HashTopic returns the TopicHash of topic.
func HashTopic(topic string) TopicHash {
	h := uint64(fnvOffset)
	for i := 0; i < len(topic); i++ {
		h ^= uint64(topic[i])
		h *= fnvPrime
	}
	return TopicHash(h)
}

// Shard returns what [Shard] returns for a record of the topic th was
// computed from.
func (th TopicHash) Shard(partition int32, offset int64, key []byte, shards int, nullKeys NullKeyPolicy) int {
	h := uint64(th)
	if key == nil {
		// A separator that no key byte sequence can produce in the keyed
		// branch, since that branch always mixes in a 0x01 first.
		h ^= 0
		h *= fnvPrime
		v := uint64(uint32(partition))
		if nullKeys == NullKeySpread {
			v = v*fnvPrime ^ uint64(offset)
		}
		for i := 0; i < 8; i++ {
			h ^= v & 0xff
			h *= fnvPrime
			v >>= 8
		}
	} else {
		h ^= 1
		h *= fnvPrime
		for _, b := range key {
			h ^= uint64(b)
			h *= fnvPrime
		}
	}
	// Fold the high bits in: FNV's low bits alone spread poorly over small
	// shard counts.
	h ^= h >> 32
	if shards&(shards-1) == 0 {
		// A power of two (as the default is): the same remainder
		// without a division, which costs tens of cycles a record.
		return int(h & uint64(shards-1))
	}
	return int(h % uint64(shards))
}
