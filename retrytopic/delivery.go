package retrytopic

import "strconv"

// HeaderDeliveryCount is, on a record a share group's member routed
// (consumer.Config.Share), how many times the broker had delivered it: its
// first delivery is 1; a crash, a lock that expired or a release before add
// one each. Records of consumer groups carry none.
const HeaderDeliveryCount = "kscope-delivery-count"

// deliveryCount reads the record's delivery count; a malformed value is
// reported and ignored.
func (d *headerDecoder) deliveryCount(m *Metadata) {
	v, ok := d.header(HeaderDeliveryCount)
	if !ok {
		return
	}
	n, err := strconv.ParseInt(string(v), 10, 32)
	if err != nil || n < 0 {
		d.bad(HeaderDeliveryCount, v)
		return
	}
	m.DeliveryCount = int32(n)
}
