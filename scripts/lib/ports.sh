# Sourced by the scripts that start servers: ports on 127.0.0.1 for them.
#
# A port is drawn below the kernel's range for the local ports of outgoing
# connections. A port from that range, free when checked, can be taken by
# any connection (a test's, a build's) before the server binds it, which a
# slow starter such as RabbitMQ does seconds later.

ephemeral_low=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
case "$ephemeral_low" in
    '' | *[!0-9]*) ephemeral_low=32768 ;;
esac
# Too low a range leaves no room below it: draw from the usual one.
[ "$ephemeral_low" -gt 11000 ] || ephemeral_low=32768

# A port from 10000 up to the start of that range.
random_port() {
    echo $((10000 + RANDOM % (ephemeral_low - 10000)))
}

# Whether something listens on the port now.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
