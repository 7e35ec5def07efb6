package partition

import (
	"encoding/binary"
	"fmt"
	"hash/crc64"
	"testing"
)

// routingDigest folds the shards of 2,000 keyed records and 64 null-key
// ones, under each null-key policy, into one number for a shard count.
func routingDigest(shards int) uint64 {
	tab := crc64.MakeTable(crc64.ECMA)
	var sum uint64
	var buf [4]byte
	for _, nullKeys := range []NullKeyPolicy{NullKeyOrdered, NullKeySpread} {
		th := HashTopic("orders.placed")
		for i := range 2000 {
			key := fmt.Appendf(nil, "customer-%d", i*7919)
			binary.LittleEndian.PutUint32(buf[:], uint32(th.Shard(int32(i%12), int64(i), key, shards, nullKeys)))
			sum = crc64.Update(sum, tab, buf[:])
		}
		for i := range 64 {
			binary.LittleEndian.PutUint32(buf[:], uint32(th.Shard(int32(i%5), int64(i*31), nil, shards, nullKeys)))
			sum = crc64.Update(sum, tab, buf[:])
		}
	}
	return sum
}

// TestRoutingNeverChanges pins the routing: which key-shard each record
// goes to under a shard count. The DB scope's stored positions hold only
// under the routing they were written under (a changed routing makes every
// member start over from the inbox), so a faster hash or reduction has to
// give the very same shards. The digests were taken from the FNV-1a
// routing as released.
func TestRoutingNeverChanges(t *testing.T) {
	want := map[int]uint64{
		1:    0x18f7f7a845c77480,
		2:    0xc9bd066f9f2d5613,
		3:    0x80f077e2c1ae67f6,
		7:    0x478ab78fe6cbab2c,
		8:    0xd6ea46733a933b6a,
		16:   0x441814ebaebf08c4,
		48:   0x4320263187825cba,
		64:   0x0e5b66ad11d1eb85,
		100:  0xf7f23adfc9a259c1,
		1024: 0x40508a2cceae12a6,
		4096: 0xbeb18e71d0a27f43,
	}
	for shards, digest := range want {
		if got := routingDigest(shards); got != digest {
			t.Errorf("routing over %d shards changed: digest %#016x, want %#016x", shards, got, digest)
		}
	}
}

// TestPowerOfTwoShardsAgreeWithDivision checks the power-of-two path
// against the division: a record's shard among 2^k is its shard among
// 3·2^k (a count that divides) modulo 2^k.
func TestPowerOfTwoShardsAgreeWithDivision(t *testing.T) {
	th := HashTopic("payments")
	for k := range 13 {
		pow := 1 << k
		for i := range 5000 {
			key := fmt.Appendf(nil, "k-%d", i)
			if i%97 == 0 {
				key = nil
			}
			got := th.Shard(int32(i%7), int64(i), key, pow, NullKeySpread)
			if want := th.Shard(int32(i%7), int64(i), key, 3*pow, NullKeySpread) % pow; got != want {
				t.Fatalf("key %q over %d shards: shard %d, the division gives %d", key, pow, got, want)
			}
		}
	}
}
