# The red team's hands inside a sandbox: one attempt per run, printed as
# one JSON line {"ok": did the attempt get through, "detail": what
# happened, "ms": elapsed}. "ok" is the attacker's view (data came back,
# a socket could be made, a packet was sent); the test decides what that
# means. Only the standard library: it runs on the base template's python3.
import json, os, random, socket, ssl, struct, sys, time

T0 = time.monotonic()


def done(ok, detail, **kw):
    kw.update(ok=bool(ok), detail=str(detail)[:400], ms=round((time.monotonic() - T0) * 1000, 1))
    print(json.dumps(kw))
    sys.exit(0)


def err(e):
    return "%s: %s" % (type(e).__name__, e)


def unescape(s):
    return s.encode().decode("unicode_escape").encode("latin-1")


def recv_all(s, limit=8192, timeout=8):
    s.settimeout(timeout)
    out = b""
    try:
        while len(out) < limit:
            b = s.recv(4096)
            if not b:
                return out, "eof"
            out += b
    except ConnectionResetError:
        return out, "reset"
    except socket.timeout:
        return out, "timeout"
    except OSError as e:
        return out, err(e)
    return out, "limit"


def tcp(host, port, payload="-", family="4"):
    fam = socket.AF_INET6 if family == "6" else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, int(port)))
    except OSError as e:
        done(False, "connect: " + err(e))
    try:
        if payload != "-":
            s.sendall(unescape(payload))
    except OSError as e:
        done(False, "send: " + err(e))
    data, end = recv_all(s)
    done(len(data) > 0, "%s after %d bytes: %r" % (end, len(data), data[:200]))


def tls(host, port, sni, http_host=""):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the attacker does not care who answers
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
    except OSError as e:
        done(False, "connect: " + err(e))
    try:
        t = ctx.wrap_socket(s, server_hostname=sni or None)
    except OSError as e:
        done(False, "handshake: " + err(e))
    req = "GET /redteam HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (http_host or sni)
    try:
        t.sendall(req.encode())
    except OSError as e:
        done(False, "send: " + err(e))
    data, end = recv_all(t)
    done(len(data) > 0, "%s after %d bytes: %r" % (end, len(data), data[:200]))


def dns_msg(name, qtype, qid, flags=0x0100, answer_ip=None):
    q = struct.pack(">HHHHHH", qid, flags, 1, 1 if answer_ip else 0, 0, 0)
    for l in name.rstrip(".").split("."):
        q += bytes([len(l)]) + l.encode()
    q += b"\0" + struct.pack(">HH", qtype, 1)
    if answer_ip:
        q += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 3600, 4) + socket.inet_aton(answer_ip)
    return q


def parse(r):
    rid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", r[:12])
    i, ips = 12, []
    for _ in range(qd):
        while r[i]:
            i += r[i] + 1
        i += 5
    for _ in range(an):
        if r[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while r[i]:
                i += r[i] + 1
            i += 1
        t, c, ttl, l = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if t == 1:
            ips.append(socket.inet_ntoa(r[i:i + 4]))
        elif t == 28:
            ips.append(socket.inet_ntop(socket.AF_INET6, r[i:i + 16]))
        i += l
    return rid, flags & 0xF, ips


def dns(server, name, qtype="1", proto="udp"):
    qid = random.randrange(65536)
    q = dns_msg(name, int(qtype), qid)
    try:
        if proto == "tcp":
            s = socket.create_connection((server, 53), timeout=5)
            s.sendall(struct.pack(">H", len(q)) + q)
            n = struct.unpack(">H", s.recv(2))[0]
            r = b""
            while len(r) < n:
                r += s.recv(n - len(r))
            src = server
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(5)
            s.sendto(q, (server, 53))
            r, (src, _) = s.recvfrom(4096)
    except OSError as e:
        done(False, "query: " + err(e))
    rid, rcode, ips = parse(r)
    done(rcode == 0 and len(ips) > 0, "from %s rcode=%d ips=%s" % (src, rcode, ",".join(ips)),
         rcode=rcode, ips=ips, id_ok=rid == qid)


def udp(host, port, payload="x"):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1)
    try:
        for _ in range(3):
            s.sendto(unescape(payload), (host, int(port)))
        data, src = s.recvfrom(4096)
        done(True, "reply from %s: %r" % (src, data[:100]))
    except socket.timeout:
        done(False, "3 datagrams sent, no reply")
    except OSError as e:
        done(False, err(e))


def raw(dst):
    """Packets below UDP/TCP: raw IP and packet sockets. With one, forge a
    DNS answer from the gateway's address and a datagram from a foreign
    source."""
    tried = []
    for fam, typ, proto, what in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP, "AF_INET/SOCK_RAW/udp"),
                                  (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, "AF_INET/SOCK_RAW/raw"),
                                  (getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW, 0x0300, "AF_PACKET/SOCK_RAW")]:
        try:
            s = socket.socket(fam, typ, proto)
        except OSError as e:
            tried.append("%s: %s" % (what, err(e)))
            continue
        tried.append(what + ": opened")
        if what == "AF_INET/SOCK_RAW/raw":
            sent = []
            for src, sport, dst, dport, body in [
                    ("100.64.0.1", 53, "100.64.0.2", 33333, dns_msg("www.test.airlock", 1, 1, 0x8180, "198.18.0.4")),
                    ("10.9.9.9", 4444, dst, 9999, b"spoofed")]:
                udph = struct.pack(">HHHH", sport, dport, 8 + len(body), 0) + body
                iph = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udph), 0, 0, 64, 17, 0,
                                  socket.inet_aton(src), socket.inet_aton(dst))
                try:
                    s.sendto(iph + udph, (dst, 0))
                    sent.append("%s->%s sent" % (src, dst))
                except OSError as e:
                    sent.append("%s->%s: %s" % (src, dst, err(e)))
            tried.append("; ".join(sent))
        s.close()
    done(any("opened" in t for t in tried), " | ".join(tried))


def bind(src, dst, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    notes = []
    for opt, name in [(15, "IP_FREEBIND"), (19, "IP_TRANSPARENT")]:
        try:
            s.setsockopt(socket.SOL_IP, opt, 1)
            notes.append(name + " set")
        except OSError as e:
            notes.append("%s: %s" % (name, err(e)))
    try:
        s.bind((src, 0))
    except OSError as e:
        done(False, "; ".join(notes) + "; bind %s: %s" % (src, err(e)))
    s.settimeout(3)
    try:
        s.connect((dst, int(port)))
        s.sendall(b"GET /spoofed HTTP/1.1\r\nHost: www.test.airlock\r\n\r\n")
        data, end = recv_all(s, timeout=3)
        done(len(data) > 0, "; ".join(notes) + "; bound %s, connected: %s %r" % (src, end, data[:100]))
    except OSError as e:
        done(False, "; ".join(notes) + "; bound %s; connect: %s" % (src, err(e)))


def icmp(host):
    notes = []
    for typ, what in [(socket.SOCK_DGRAM, "ping socket"), (socket.SOCK_RAW, "raw ICMP")]:
        try:
            s = socket.socket(socket.AF_INET, typ, socket.IPPROTO_ICMP)
        except OSError as e:
            notes.append("%s: %s" % (what, err(e)))
            continue
        s.settimeout(2)
        body = b"airlock-tunnel" * 4
        pkt = struct.pack(">BBHHH", 8, 0, 0, 0x4141, 1) + body
        c = sum(struct.unpack(">%dH" % (len(pkt) // 2), pkt))
        c = (c >> 16) + (c & 0xFFFF)
        c = ~(c + (c >> 16)) & 0xFFFF
        pkt = pkt[:2] + struct.pack(">H", c) + pkt[4:]
        try:
            s.sendto(pkt, (host, 0))
            r, src = s.recvfrom(2048)
            done(True, "%s: reply from %s" % (what, src))
        except socket.timeout:
            notes.append("%s: sent, no reply in 2 s" % what)
        except OSError as e:
            notes.append("%s: %s" % (what, err(e)))
    done(False, "; ".join(notes))


def ipv6(dst, port):
    addrs = ""
    try:
        addrs = open("/proc/net/if_inet6").read().strip().replace("\n", "; ")
    except OSError as e:
        addrs = err(e)
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect((dst, int(port)))
        s.sendall(b"GET /v6 HTTP/1.1\r\nHost: six.test.airlock\r\n\r\n")
        data, end = recv_all(s)
        done(len(data) > 0, "if_inet6 [%s]; connected: %s %r" % (addrs, end, data[:100]))
    except OSError as e:
        done(False, "if_inet6 [%s]; connect %s: %s" % (addrs, dst, err(e)))


def forge_gateway(name, ip):
    """A forged DNS response (QR set) sent to the gateway's resolver, then
    a real query for the same name: is the forgery believed?"""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    for qid in range(0, 65536, 4099):
        s.sendto(dns_msg(name, 1, qid, 0x8580, ip), ("100.64.0.1", 53))
    notes = "18 forged responses sent"
    try:
        r, _ = s.recvfrom(4096)
        rid, rcode, ips = parse(r)
        notes += "; gateway replied rcode=%d" % rcode
    except socket.timeout:
        notes += "; no reply"
    except OSError as e:
        notes += "; " + err(e)
    qid = random.randrange(65536)
    s.sendto(dns_msg(name, 1, qid), ("100.64.0.1", 53))
    try:
        r, _ = s.recvfrom(4096)
        while parse(r)[0] != qid:
            r, _ = s.recvfrom(4096)
    except OSError as e:
        done(False, notes + "; real query: " + err(e))
    rid, rcode, ips = parse(r)
    done(ip in ips, notes + "; real query answered rcode=%d ips=%s" % (rcode, ",".join(ips)), ips=ips)


def keepalive(host, port, host1, host2):
    s = socket.create_connection((host, int(port)), timeout=5)
    got = []
    for h, p in [(host1, "/first"), (host2, "/second")]:
        try:
            s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (p, h)).encode())
            s.settimeout(5)
            b = s.recv(4096)
            got.append("%s: %r" % (h, b[:120]) if b else "%s: eof" % h)
            if not b:
                break
        except OSError as e:
            got.append("%s: %s" % (h, err(e)))
            break
    done(len(got) == 2 and "HTTP/1.1 200" in got[1], " | ".join(got))


def resolv():
    try:
        with open("/etc/resolv.conf", "a") as f:
            f.write("nameserver 8.8.8.8\n")
        done(True, "appended to /etc/resolv.conf: " + open("/etc/resolv.conf").read().replace("\n", "; "))
    except OSError as e:
        done(False, "write /etc/resolv.conf: %s; it reads: %s" % (err(e), open("/etc/resolv.conf").read().replace("\n", "; ")))


def mac_spoof(host, port, http_host, new_mac="52:54:00:de:ad:01", ifname="eth0"):
    """A VM's root gives its NIC another MAC, announces it for its own
    address (gratuitous ARP replies to the gateway) and connects: does
    anything answer frames from a MAC that is not the sandbox's?"""
    import fcntl
    SIOCGIFHWADDR, SIOCSIFHWADDR = 0x8927, 0x8924
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    old = fcntl.ioctl(ctl, SIOCGIFHWADDR, struct.pack("16sH14s", ifname.encode(), 0, b""))[18:24]
    new = bytes.fromhex(new_mac.replace(":", ""))

    def set_mac(m):
        fcntl.ioctl(ctl, SIOCSIFHWADDR, struct.pack("16sH6s8s", ifname.encode(), 1, m, b""))

    try:
        set_mac(new)
    except OSError as e:
        done(False, "set MAC %s: %s" % (new_mac, err(e)))
    notes, data = ["MAC %s -> %s" % (old.hex(":"), new_mac)], b""
    try:
        try:
            p = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
            p.bind((ifname, 0))
            me, gw = socket.inet_aton("100.64.0.2"), socket.inet_aton("100.64.0.1")
            for _ in range(3):
                p.send(b"\xff" * 6 + new + b"\x08\x06" +
                       struct.pack(">HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 2, new, me, b"\xff" * 6, gw))
            notes.append("3 gratuitous ARP replies sent")
        except OSError as e:
            notes.append("gratuitous ARP: " + err(e))
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect((host, int(port)))
            s.sendall(("GET /macspoof HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % http_host).encode())
            data, end = recv_all(s, timeout=5)
            notes.append("connected: %s after %d bytes: %r" % (end, len(data), data[:120]))
        except OSError as e:
            notes.append("connect: " + err(e))
    finally:
        set_mac(old)
    done(len(data) > 0, "; ".join(notes))


def arp_spoof(ifname="eth0"):
    """Forged ARP from a VM: a request for the gateway whose sender is
    another address (100.64.0.3), and replies claiming the VM's own address
    for another MAC (with and without that MAC as the frame's source). Did
    the gateway answer the forged request?"""
    p = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    p.bind((ifname, 0))
    mine = p.getsockname()[4]
    evil = bytes.fromhex("525400dead02")
    gw, me, other = (socket.inet_aton(a) for a in ("100.64.0.1", "100.64.0.2", "100.64.0.3"))
    bcast, zero = b"\xff" * 6, b"\0" * 6

    def frame(src, op, sha, spa, tha, tpa):
        return bcast + src + b"\x08\x06" + struct.pack(">HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, sha, spa, tha, tpa)

    p.send(frame(mine, 1, mine, other, zero, gw))
    p.send(frame(evil, 2, evil, me, zero, gw))
    p.send(frame(mine, 2, evil, me, zero, gw))
    notes = ["sent: request as 100.64.0.3; replies 100.64.0.2 is-at 52:54:00:de:ad:02 (frame source forged and not)"]
    p.settimeout(0.3)
    deadline, answered = time.monotonic() + 2, False
    while time.monotonic() < deadline:
        try:
            f = p.recv(2048)
        except socket.timeout:
            continue
        if len(f) >= 42 and f[12:14] == b"\x08\x06" and f[20:22] == b"\0\x02" and f[28:32] == gw and f[38:42] == other:
            answered = True
            notes.append("the gateway answered the request as 100.64.0.3")
            break
    if not answered:
        notes.append("no answer to the forged request in 2 s")
    done(answered, "; ".join(notes))


def ipv6_root(dst, port, ifname="eth0"):
    """A VM's root turns IPv6 back on, adds 2001:db8::5/64 to its NIC and
    connects on-link to dst; and sends a datagram to all nodes (ff02::1)."""
    import fcntl

    def sysctl(v):
        for k in ("all", "default", ifname):
            with open("/proc/sys/net/ipv6/conf/%s/disable_ipv6" % k, "w") as f:
                f.write(v)

    try:
        sysctl("0")
    except OSError as e:
        done(False, "turn IPv6 on: " + err(e))
    notes, data = ["IPv6 on"], b""
    try:
        idx = socket.if_nametoindex(ifname)
        s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            fcntl.ioctl(s6, 0x8916, struct.pack("16sIi", socket.inet_pton(socket.AF_INET6, "2001:db8::5"), 64, idx))  # SIOCSIFADDR
            notes.append("2001:db8::5/64 added")
        except OSError as e:
            notes.append("add 2001:db8::5/64: " + err(e))
        time.sleep(2)  # duplicate address detection
        try:
            s6.sendto(b"airlock-v6", ("ff02::1", 9999, 0, idx))
            notes.append("UDP to ff02::1 sent")
        except OSError as e:
            notes.append("UDP to ff02::1: " + err(e))
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect((dst, int(port), 0, 0))
            s.sendall(b"GET /v6 HTTP/1.1\r\nHost: six.test.airlock\r\n\r\n")
            data, end = recv_all(s, timeout=5)
            notes.append("connected: %s %r" % (end, data[:100]))
        except OSError as e:
            notes.append("connect %s: %s" % (dst, err(e)))
        try:
            notes.append("if_inet6 [%s]" % open("/proc/net/if_inet6").read().strip().replace("\n", "; "))
        except OSError:
            pass
    finally:
        sysctl("1")
    done(len(data) > 0, "; ".join(notes))


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
