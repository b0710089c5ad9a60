# Sends one TCP ACK from src:sport to dst:dport with a sequence number far
# outside any window (conntrack: INVALID), as an Ethernet frame on ifname
# (to MAC dmac): below the sending host's netfilter.
import socket, struct, sys
ifname, dmac, src, sport, dst, dport = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
seq, ack = int(sys.argv[7]), int(sys.argv[8])
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b)//2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
tcp = struct.pack('!HHIIBBHHH', sport, dport, seq, ack, 5 << 4, 0x10, 65535, 0, 0)
pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack('!BBH', 0, 6, len(tcp))
tcp = tcp[:16] + struct.pack('!H', csum(pseudo + tcp)) + tcp[18:]
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(tcp), 1, 0, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
smac = s.getsockname()[4]
s.send(bytes.fromhex(dmac.replace(':', '')) + smac + b'\x08\x00' + ip + tcp)
