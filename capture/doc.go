// Package capture reads and writes packet captures of iWARP traffic.
//
// [ReadFile] reads a pcap or pcapng file (any of the usual link types:
// Ethernet, raw IP, Linux cooked, loopback) with gopacket's pcapgo and
// returns its TCP segments, ready for an [inspect.Analyzer]. [Writer]
// writes TCP segments as a pcapng file of raw IP packets (pcapgo's
// NgWriter), each with an optional comment, for Wireshark and tshark.
package capture
