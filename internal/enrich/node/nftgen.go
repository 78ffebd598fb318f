package node

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nftables' netlink numbers (linux/netfilter/nfnetlink.h, nf_tables.h).
const (
	nfnlSubsysNFTables = 10
	nftMsgGetGen       = 16
	nftaGenID          = 1
)

// nftGeneration asks the kernel for the namespace's nftables generation: a
// counter every committed ruleset change (kube-proxy's syncs, portmap's
// ADD and DEL, iptables-nft) increments. Listing a big ruleset costs nft
// seconds; this costs one netlink round trip, so the ruleset is listed
// again only when the generation moved. nsFD is the namespace (0: the
// caller's). The caller must know nf_tables is loaded: the request would
// load the module otherwise.
func nftGeneration(nsFD int) (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFD})
	if err != nil {
		return 0, fmt.Errorf("open nfnetlink: %w", err)
	}
	defer c.Close()
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | nftMsgGetGen), Flags: netlink.Request},
		// struct nfgenmsg: family AF_UNSPEC, version NFNETLINK_V0, res_id 0.
		Data: []byte{unix.AF_UNSPEC, 0, 0, 0},
	}
	msgs, err := c.Execute(req)
	if err != nil {
		return 0, fmt.Errorf("get nftables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("decode nftables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == nftaGenID {
				return ad.Uint32(), nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, fmt.Errorf("decode nftables generation: %w", err)
		}
	}
	return 0, errors.New("get nftables generation: no NFTA_GEN_ID in the answer")
}

// nftMsgGetTable and nftaTableName are nf_tables.h's NFT_MSG_GETTABLE and
// NFTA_TABLE_NAME.
const (
	nftMsgGetTable = 1
	nftaTableName  = 1
)

// nftFamilies are nft's names of the NFPROTO_* families.
var nftFamilies = map[uint8]string{1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}

// nftTableNames asks the kernel for the namespace's nftables tables, as
// "family name". `nft list tables` takes as long as listing every rule
// (nft fills its whole cache first): two seconds on a node of 100,000
// iptables-nft rules. The same conditions as nftGeneration apply.
func nftTableNames(nsFD int) ([]string, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFD})
	if err != nil {
		return nil, fmt.Errorf("open nfnetlink: %w", err)
	}
	defer c.Close()
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | nftMsgGetTable), Flags: netlink.Request | netlink.Dump},
		Data:   []byte{unix.AF_UNSPEC, 0, 0, 0},
	}
	msgs, err := c.Execute(req)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var out []string
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		family, ok := nftFamilies[m.Data[0]]
		if !ok {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("decode nftables table: %w", err)
		}
		for ad.Next() {
			if ad.Type() == nftaTableName {
				out = append(out, family+" "+ad.String())
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("decode nftables table: %w", err)
		}
	}
	return out, nil
}
